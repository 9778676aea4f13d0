"""Secrets out of engine log lines, by shape: what reaches ``/status``, the page and ``wait``.

No I/O. Five shapes, each on its own:

- a key naming a secret, then its value: ``auth_token=X``, ``password: X``,
  ``"api_key": "X"``, ``'hf_token': 'X'``, ``AWS_SECRET_ACCESS_KEY=X``, ``--api-key X``,
  ``Cookie: a=b; c=d``, ``Authorization: Bearer X``;
- a secret's environment variable name, a space, and a generated-looking value:
  ``WANDB_API_KEY 3f9a...``;
- URL credentials (also percent-encoded) and query parameters naming secrets:
  ``https://user:X@host``, ``user%3AX%40host``,
  ``?token=X&...``, ``?key=X`` (Google), ``X-Amz-Signature=X``;
- token formats that are secrets wherever they appear: OpenAI ``sk-``, Hugging Face ``hf_``,
  AWS ``AKIA``/``ASIA``, GitHub ``ghp_``/``gho_``/``github_pat_``, Slack ``xox?-``, JWT
  ``eyJ...``, Google ``AIza``, a PEM private key;
- ``Bearer``/``Basic`` credentials.

A key names a secret when its last word does (``auth_token``, ``apiKey``, ``SECRET_ACCESS_KEY``),
so ``max_tokens=2048``, ``tokenizer=...``, ``token_count=3`` and ``#full token: 16978`` stay.

Every pattern is bounded (keys to 64 characters, quoted values to 1,024), so a hostile line
costs time linear in its length: these run on every line read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from typing import Final

from exporter.base.linear import present, screen_of

REDACTED: Final = "<redacted>"

#: Last words of a key that make its value a secret ("tokens", "tokenizer" do not).
_SECRET_WORDS: Final = frozenset(
    {
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "apikey",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "session",
        "sessionid",
        "cookie",
        "signature",
    }
)
#: Words after the secret's own that name a part of it, not something else: a
#: ``client_secret_value``, a ``private_key_b64``. (``_file`` and ``_path`` are left: they
#: name where a secret is, which is not one.) ``_id`` counts after ``key`` only: a
#: service-account's ``private_key_id``, but a ``mask_token_id`` is a vocabulary index.
_QUALIFIERS: Final = frozenset({"value", "b64", "base64", "hex", "data", "raw", "str"})
#: Two last words that together name a secret ("api_key", "access_key", "private_key").
_SECRET_PAIRS: Final = frozenset(
    {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("auth", "key")}
)
# Words of a key: "AWS_SECRET_ACCESS_KEY", "authToken", "x-api-key", "HFToken".
_KEY_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")

# A key (any identifier with a secret-ish word in it), an optional closing quote, = or :, and
# the value: a list, a quoted string, or a bare word. The key must start a word.
_HINTED_KEY = (
    r"(?:token|secret|passw|pwd|passphrase|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|credential|auth|session|cookie|signature|\bkey\b)"
)
_PAIR = re.compile(
    r"(?<![\w.-])(?P<key>[\w.-]{0,64}?" + _HINTED_KEY + r"[\w.-]{0,64}?)"
    r"(?P<sep>['\"]?\s*[:=]\s*)"
    r"(?P<scheme>(?:Bearer|Basic|Token|Digest)\s+)?"
    r"(?P<value>\[[^\]]{0,1024}\]|'[^']{0,1024}'|\"[^\"]{0,1024}\"|[^\s,;)'\"\[\]<>&]+)",
    re.I,
)
# Where ``_PAIR`` can match: its key is a whole run of ``[\w.-]`` (the look-behind starts it
# at a run's start; its separator's first character is none of them), followed by the
# separator. One scan finds these runs, linear in the line; ``_PAIR`` is tried at each,
# where on a 10 kB ServerArgs line its own scan tried 128 key lengths at every word.
_KEY_RUN = re.compile(r"(?<![\w.-])[\w.-]+(?=['\"]?\s*[:=])")
_DOTTED_I: Final = str.maketrans({"\u0130": "i", "\u0131": "i"})
# The run of key characters that ends at the end of the text searched.
_RUN_BEFORE = re.compile(r"(?:.*[^\w.-])?([\w.-]*)", re.S)
#: How far before one of ``_KEY_HINTS`` a key ``_PAIR`` matches can start: 64 characters,
#: then the rest of a word ``_HINTED_KEY`` names ("private_" before "key").
_KEY_REACH: Final = 64 + len("private_") + 1
# "#full token: 16978", "BOS token = 2": a statistic printed, not a secret assigned.
_STATISTIC = re.compile(r"\d+(?:\.\d+)?(?:ms|s|%)?")
# "allow_credentials=False", "api_key=None": a setting's absence, never a secret.
_NOT_SET = frozenset({"true", "false", "none", "null", "''", '""'})
# A cookie header's value runs to the end of the header, over its "; ".
_COOKIE = re.compile(r"(?<![\w-])((?:set-)?cookie['\"]?\s*[:=]\s*)([^'\"\r\n]{1,4096})", re.I)
# --api-key X, --hf-token X (a flag and the next argument); never the next flag.
_FLAG = re.compile(
    r"(--[\w-]{0,64}?(?:api[-_]?key|token|secret|password|passwd|credentials?)(?:=|\s+))"
    r"(?!--)('[^']{0,1024}'|\"[^\"]{0,1024}\"|\S+)",
    re.I,
)
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]{0,15}://)[^/\s@?#]{1,256}@", re.I)
# A word that may hold percent-encoded userinfo (a URL inside a query or a form,
# ``https%3A%2F%2Fuser%3Apw%40host``, or ``user%3Apw%40host`` alone); ``_encoded_userinfo``
# reads it with string searches, linear in its length.
_ENCODED_WORD = re.compile(r"[^\s\"'&=?,()\[\]<>]{1,4096}")
# A secret's name in the shape of an environment variable, a space, then its value, as
# ``env`` dumps and launch scripts print them: ``WANDB_API_KEY 3f9a...``. Only a value that
# looks generated (letters and digits, 8 or more) goes: ``HF_TOKEN is not set`` stays.
_ENV_SPACED = re.compile(
    r"(?<![\w-])(?P<key>[A-Z][A-Z0-9]{0,32}(?:_[A-Z0-9]{1,32}){1,8})(?P<sep>[ \t]+)"
    r"(?P<value>(?=[^\s]{0,1024}\d)(?=[^\s]{0,1024}[A-Za-z])[A-Za-z0-9_./+=:-]{8,1024})"
)
# Query parameters whose name alone says secret in a URL ("key", "sig").
_QUERY_SECRET = re.compile(r"([?&](?:key|sig|code)=)[^&#\s'\"]+", re.I)
_BEARER = re.compile(r"\b(Bearer|Basic)(\s+)[A-Za-z0-9._~+/=-]{6,}", re.I)
# Each format's prefix is kept, so a reader still sees which kind of token was there; each
# is tried only on lines holding one of its literals (most lines hold none), and only where
# one of them occurs: each pattern starts with one.
_FORMATS: Final = tuple(
    (literals, re.compile(pattern))
    for literals, pattern in (
        # OpenAI keys are random: they hold a digit ("sk-models" in a path does not).
        (("sk-",), r"\b(sk-)(?=[A-Za-z_-]{0,200}\d)[A-Za-z0-9_-]{6,}"),
        (("hf_",), r"\b(hf_)[A-Za-z0-9]{16,}"),
        (("AKIA", "ASIA", "ABIA", "ACCA"), r"\b(AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b"),
        (("github_pat_",), r"\b(github_pat_)[A-Za-z0-9_]{20,}"),
        (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"\b(gh[pousr]_)[A-Za-z0-9]{20,}"),
        (("xox",), r"\b(xox[abposr]-)[A-Za-z0-9-]{10,}"),
        (("eyJ",), r"\b(eyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
        (("AIza",), r"\b(AIza)[0-9A-Za-z_-]{35}"),
        (("-----BEGIN",), r"(-----BEGIN [A-Z ]{0,32}PRIVATE KEY-----).*"),
    )
)
#: Lower-case words one of which a key naming a secret holds (see ``_HINTED_KEY``).
_KEY_HINTS: Final = (
    "token",
    "secret",
    "passw",
    "pwd",
    "passphrase",
    "key",
    "credential",
    "auth",
    "session",
    "cookie",
    "signature",
)


def names_secret(key: str) -> bool:
    """Whether a key's last word (or two) names a secret: ``auth_token``, not ``max_tokens``."""
    words = [w.lower() for w in _KEY_WORDS.findall(key)]
    while len(words) > 1 and (words[-1] in _QUALIFIERS or words[-2:] == ["key", "id"]):
        words.pop()
    if words == ["key"]:  # a bare ``key=``: Google's query parameter, a client's config field
        return True
    return bool(words) and (words[-1] in _SECRET_WORDS or tuple(words[-2:]) in _SECRET_PAIRS)


def _hidden(value: str) -> str:
    """The value replaced, keeping its brackets or quotes so the line still reads."""
    if value.startswith("["):
        return f"[{REDACTED}]"
    if value[:1] in "'\"" and len(value) > 1:
        return f"{value[0]}{REDACTED}{value[0]}"
    return REDACTED


def _pair(m: re.Match[str]) -> str:
    key, sep, scheme, value = m.group("key", "sep", "scheme", "value")
    if not names_secret(key):
        return m.group()
    if value.lower() in _NOT_SET:
        return m.group()
    if key.lower() == "key" and "=" not in sep and value[:1] not in "'\"":
        return m.group()  # prose ("dispatch key: X"); ``key=X`` and ``"key": "X"`` go
    if not scheme and (":" in sep or " " in sep) and _STATISTIC.fullmatch(value):
        return m.group()
    return f"{key}{sep}{scheme or ''}{_hidden(value)}"


def _sub_at(
    pattern: re.Pattern[str], text: str, starts: Iterable[int], repl: Callable[[re.Match[str]], str]
) -> str:
    """``pattern.sub(repl, text)`` for a pattern that can only match at one of ``starts``.

    ``starts`` ascend. ``re`` alone tries every position of the line, which on a 10 kB line
    costs a millisecond a pattern; a word boundary or a look-behind still sees what comes
    before a start.
    """
    out: list[str] = []
    done = 0  # ``sub`` resumes after a match: nothing inside a replaced span starts another
    for start in starts:
        if start < done:
            continue
        m = pattern.match(text, start)
        if m is not None:
            out += (text[done:start], repl(m))
            done = m.end()
    return "".join((*out, text[done:])) if out else text


def _key_starts(text: str) -> Iterable[int]:
    """Where ``_PAIR`` can match: at each run of key characters holding a secret's word."""
    if not text.isascii():  # case folding may move positions: each run is looked at
        return (r.start() for r in _KEY_RUN.finditer(text) if _might_name_secret(r.group()))
    low, starts = text.lower(), set()
    for at in _occurrences(low, _KEY_HINTS):
        # The run the word is in starts within a key's reach before it, or cannot be a key.
        reach = max(0, at - _KEY_REACH)
        start = _RUN_BEFORE.match(text, reach, at)
        if start is not None and (start.start(1) > reach or reach == 0):
            starts.add(start.start(1))
    return sorted(starts)


def _occurrences(text: str, literals: Iterable[str]) -> list[int]:
    """Where each of ``literals`` occurs in ``text``, ascending."""
    found = []
    for literal in literals:
        at = text.find(literal)
        while at >= 0:
            found.append(at)
            at = text.find(literal, at + 1)
    return sorted(found)


def _might_name_secret(key: str) -> bool:
    """Whether ``key`` holds one of ``_HINTED_KEY``'s words (a superset: "key" in "keys")."""
    # ``re``'s IGNORECASE also folds the long s (U+017F) to "s" and both dotted and dotless
    # capital I to "i".
    low = key.lower() if key.isascii() else key.translate(_DOTTED_I).casefold()
    return any(hint in low for hint in _KEY_HINTS)


def _kept_prefix(m: re.Match[str]) -> str:
    """A token format's match hidden but for its prefix (group 1): ``hf_<redacted>``."""
    return f"{m.group(1)}{REDACTED}"


def _encoded_userinfo(m: re.Match[str]) -> str:
    """A word with the userinfo before its first encoded "@" hidden.

    The userinfo starts after an encoded "//", or at the word's start when it holds an
    encoded ":" (``user%3Apw%40host``; ``ops%40host`` is an address and stays).
    """
    word = m.group()
    low = word.lower()
    at = low.find("%40")
    if at < 0:
        return word
    slashes = low.rfind("%2f%2f", 0, at)
    start = slashes + 6 if slashes >= 0 else 0
    info = low[start:at]
    if not info or "%2f" in info or (slashes < 0 and "%3a" not in info):
        return word  # a path (``%2Fv%40x``) or an address, not credentials
    return f"{word[:start]}{REDACTED}{word[at:]}"


def _spaced(m: re.Match[str]) -> str:
    key, sep = m.group("key", "sep")
    return f"{key}{sep}{REDACTED}" if names_secret(key) else m.group()


def _screened(pattern: re.Pattern[str]) -> str:
    """A pass's pattern as RE2 reads it, a little wider.

    Without its leading look-behind, and no bound over RE2's 1,000 on a repeat.
    """
    wide = re.sub(r"\{(\d+),\d{4,}\}", r"{\1,}", pattern.pattern)
    return re.sub(r"^\(\?<![^)]*\)", "", wide)


#: The end of a key ``names_secret`` accepts: a secret word (or "key"), then only words
#: naming a part of it, then the separator. A screen for ``_PAIR``: "max_tokens=",
#: "tokenizer:" and "token_count=" are ruled out before ``re`` scans the line.
_SECRET_KEY_END: Final = (
    r"(?:token|secret|passw(?:or)?d|pwd|passphrase|key|credentials?|auth(?:orization)?"
    r"|session(?:id)?|cookie|signature)"
    r"(?:[_.-]*(?:value|b64|base64|hex|data|raw|str|id))*[_.-]*['\"]?"
    # Then a separator and a value ``_pair`` keeps no statistic for: "=" with no space or
    # colon in its separator, or a value quoted, bracketed or holding more than digits and
    # dots ("#new-token: 821" is a count, and SGLang prints one a request).
    r"(?:[^\S ]*=[^\S ]*\S|\s*[:=]\s*(?:['\"\[]|[\d.]*[^\d.\s,;)'\"\[\]<>&]))"
)
#: ``_ENV_SPACED``'s shape for RE2 (which has no look-ahead), its key holding a secret word
#: in capitals, as every key ``names_secret`` accepts in that shape does.
_ENV_SPACED_SHAPE: Final = (
    r"(?-i:[A-Z0-9_]*(?:" + "|".join(h.upper() for h in _KEY_HINTS) + r")[A-Z0-9_]*"
    r"[ \t]+[A-Za-z0-9_./+=:-]{8})"
)
#: ``_FLAG``'s flag for RE2 (which has no look-ahead).
_FLAG_SHAPE: Final = r"--[\w-]*(?:api[-_]?key|token|secret|passw(?:or)?d|credential)"

#: What each pass needs, as one linear scan: most lines hold none of it, and the scan
#: costs a microsecond where the passes cost tens. A pass whose pattern RE2 can read is
#: screened by the pattern itself, the others by a wider shape or their literals.
_NEEDS: Final = (
    _screened(_URL_USERINFO),
    "%40",
    _screened(_QUERY_SECRET),
    _screened(_COOKIE),
    _FLAG_SHAPE,
    _SECRET_KEY_END,
    _ENV_SPACED_SHAPE,
    _screened(_BEARER),
    *("|".join(literals) for literals, _ in _FORMATS),
)
_URL, _ENCODED_AT, _QUERY, _COOKIE_PAIR, _DASHES, _KEY_PAIR, _ENV_NAME = range(7)
_BEARER_WORD, _FORMAT_FROM = 7, 8
_SCREEN: Final = screen_of(_NEEDS)
#: What ``redact``'s screen looks for, for a caller that scans a line for more than this:
#: the indices of its hits, less its offset, are ``redact``'s ``shapes``.
REDACT_SCREEN: Final = _NEEDS


def redact(text: str, shapes: Collection[int] | None = None) -> str:
    """Replace secrets in one line with ``<redacted>``, by shape (see the module docstring).

    Each pass runs only on lines holding its literal (one scan finds which), and most lines
    of a log hold none. ``shapes``: that scan's hits (``REDACT_SCREEN``'s indices), where
    the caller's own scan of the whole text found them.
    """
    # The screen always compiles (a test checks); without it every pass runs.
    if shapes is not None:
        found = shapes
    elif _SCREEN is None:
        found = set(range(len(_NEEDS)))
    else:
        found = set(present(_SCREEN, text))
    if not found:  # most lines: no pass to try
        return text
    if _URL in found:
        text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    if _ENCODED_AT in found:
        text = _ENCODED_WORD.sub(_encoded_userinfo, text)
    if _QUERY in found:
        text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    if _COOKIE_PAIR in found:
        text = _COOKIE.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    if _DASHES in found:
        text = _FLAG.sub(lambda m: f"{m.group(1)}{_hidden(m.group(2))}", text)
    if _KEY_PAIR in found:
        text = _sub_at(_PAIR, text, _key_starts(text), _pair)
    if _ENV_NAME in found:
        text = _ENV_SPACED.sub(_spaced, text)
    if _BEARER_WORD in found:
        text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    for i, (literals, pattern) in enumerate(_FORMATS, _FORMAT_FROM):
        if i in found:
            text = _sub_at(pattern, text, _occurrences(text, literals), _kept_prefix)
    return text
