"""Reading one TOML table: typed accessors that record problems, and the value checks.

Every table of the file (exporter, target, discovery) is read through ``Table``: a missing key
gives its default, a mistyped one records ``file: field: reason`` and gives the default too,
so one run reports every problem. The checks return a reason, or None when the value is good.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Final, TypeVar
from urllib.parse import urlsplit

import httpx

from exporter.base.errors import ConfigError

# Checked with fullmatch: "$" would let a trailing newline through (into a label value).
_BARE_KEY = re.compile(r"[A-Za-z0-9_\-\[\]]+")
# C0 and C1 controls and DEL: never meant in a URL, a path, a name or a label value.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_T = TypeVar("_T")
_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?!s))?\s*"
    r"(?:(\d+(?:\.\d+)?)s)?\s*(?:(\d+(?:\.\d+)?)ms)?\s*$"
)


def parse_duration(value: object) -> float:
    """Seconds from a number or a Prometheus-style duration ("1m30s", "500ms", "2h").

    Raises:
        ValueError: the value is not a non-negative duration.
    """
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 10s or 1m30s")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("must not be negative")
        return float(value)
    if isinstance(value, str) and value.strip():
        m = _DURATION.match(value)
        if m and any(m.groups()):
            h, mi, s, ms = (float(g) if g else 0.0 for g in m.groups())
            return h * 3600 + mi * 60 + s + ms / 1000
    raise ValueError(f"{value!r} is not a duration such as 10s or 1m30s")


class Table:
    """One TOML table being read: typed accessors record a problem instead of stopping.

    Every accessor marks its key as seen (see ``reject_unknown``) and returns the type it
    names; a missing key gives the default, a mistyped one records ``must be ...`` and gives
    the default too, so reading goes on and one run reports every problem.
    """

    def __init__(
        self, path: str, errors: list[ConfigError], where: str, table: Mapping[str, object]
    ) -> None:
        self.path, self.errors, self.where, self.table = path, errors, where, table
        self.seen: set[str] = set()

    def field_name(self, key: str) -> str:
        """The dotted name of key in error messages (``target[0].completion``)."""
        # A key from the file may hold anything; quote odd ones so an error stays one line.
        shown = key if _BARE_KEY.fullmatch(key) else repr(key)
        return f"{self.where}.{shown}" if self.where else shown

    def fail(self, key: str, reason: str) -> None:
        """Record a problem with one key of this table."""
        self.errors.append(ConfigError(self.path, self.field_name(key), reason))

    def sub(self, key: str, table: Mapping[str, object]) -> Table:
        """A reader for the nested table under key, reporting into the same list."""
        return Table(self.path, self.errors, self.field_name(key), table)

    def _typed(self, key: str, kind: type[_T], *, required: bool = False) -> _T | None:
        self.seen.add(key)
        if key not in self.table:
            if required:
                self.fail(key, "is required")
            return None
        value = self.table[key]
        # bool is an int in Python, never in TOML: ``max_tokens = true`` is a mistake.
        if isinstance(value, bool) and kind is not bool:
            self.fail(key, f"must be {_KIND_NAMES[kind]}, not a boolean")
            return None
        if not isinstance(value, kind):
            self.fail(key, f"must be {_KIND_NAMES[kind]}, not {_toml_type(value)}")
            return None
        return value

    def required_str(self, key: str) -> str | None:
        """A string that must be present; None (and a problem recorded) otherwise."""
        return self._typed(key, str, required=True)

    def optional_str(self, key: str) -> str | None:
        """A string, or None when absent or mistyped."""
        return self._typed(key, str)

    def str_field(self, key: str, default: str) -> str:
        """A string with a default."""
        value = self._typed(key, str)
        return default if value is None else value

    def int_field(self, key: str, default: int) -> int:
        """An integer with a default."""
        value = self._typed(key, int)
        return default if value is None else value

    def bool_field(self, key: str, default: bool) -> bool:
        """A boolean with a default."""
        value = self._typed(key, bool)
        return default if value is None else value

    def table_field(self, key: str) -> Mapping[str, object]:
        """A nested table; empty when absent or mistyped."""
        value: Mapping[str, object] | None = self._typed(key, dict)
        return {} if value is None else value

    def list_field(self, key: str) -> list[object] | None:
        """A list of anything (the caller checks the items), or None when absent or mistyped."""
        value: list[object] | None = self._typed(key, list)
        return value

    def str_list(self, key: str, rule: Callable[[str], str | None]) -> tuple[str, ...]:
        """A list of strings, each passing rule; a bad item is reported as ``key[i]``."""
        good: list[str] = []
        for i, item in enumerate(self.list_field(key) or ()):
            if not isinstance(item, str):
                self.fail(f"{key}[{i}]", "must be a string")
            elif reason := rule(item):
                self.fail(f"{key}[{i}]", reason)
            else:
                good.append(item)
        return tuple(good)

    def duration(self, key: str, default: float | None) -> float | None:
        """A duration key (number of seconds or "1m30s")."""
        self.seen.add(key)
        if key not in self.table:
            return default
        try:
            return parse_duration(self.table[key])
        except ValueError as exc:
            self.fail(key, str(exc))
            return default

    def check(self, key: str, value: _T | None, rule: Callable[[_T], str | None]) -> None:
        """Apply a rule that returns a reason when the value is wrong."""
        if value is not None and (reason := rule(value)):
            self.fail(key, reason)

    def reject_unknown(self) -> None:
        """Record every key that no one asked for."""
        for key in self.table:
            if key not in self.seen:
                self.fail(key, "unknown key")


_KIND_NAMES: Final[Mapping[type, str]] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "a table",
}


def _toml_type(value: object) -> str:
    return _KIND_NAMES.get(type(value), type(value).__name__)


def check_text(value: str) -> str | None:
    r"""No control characters (a TOML escape such as \t or \n is one); shown escaped."""
    if m := _CONTROL.search(value):
        return f"must not contain control characters ({m.group()!r} at position {m.start()})"
    return None


def check_word(value: str) -> str | None:
    """A name or URL: no control characters and no whitespace anywhere."""
    if reason := check_text(value):
        return reason
    if m := re.search(r"\s", value):
        return f"must not contain whitespace ({m.group()!r} at position {m.start()})"
    return None


def check_url(value: str) -> str | None:
    """A target's base URL: http(s), a host, no credentials, query or fragment."""
    if reason := check_word(value):
        return reason
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError as exc:  # "http://[" and "http://[zz]": urllib raises, not returns
        return f"is not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "scheme must be http or https"
    if not host:
        return "must name a host"
    if parts.username or parts.password:
        return "must not carry credentials; use api_key_file"
    try:
        port = parts.port
    except ValueError:
        return "has an invalid port"
    if port == 0:
        return "port must be between 1 and 65535"
    if parts.query or parts.fragment:
        return "must not carry a query or fragment"
    return http_client_refusal(value, "/")


def http_client_refusal(base_url: str, path: str) -> str | None:
    """Why the probes' HTTP client would refuse this URL, or None: built by httpx itself.

    urllib and httpx disagree at the edges (IDNA host names, IPv4 octets, what follows an
    IPv6 literal); a URL that passed here but not there killed the daemon at start or reload.
    Building the client opens nothing (about a millisecond).
    """
    try:
        with httpx.Client(base_url=base_url, trust_env=False, verify=False) as client:
            client.build_request("GET", path)
    except Exception as exc:  # InvalidURL, and idna's own errors, which httpx lets through
        return "is refused by the HTTP client: " + " ".join(str(exc).split())
    return None


def check_path(value: str) -> str | None:
    """A URL path: no whitespace, starting with /."""
    if reason := check_word(value):
        return reason
    return None if value.startswith("/") else "must start with /"


def check_file_path(value: str) -> str | None:
    """A file system path: absolute (the daemon's working directory is nobody's choice)."""
    if reason := check_text(value):
        return reason
    if value != value.strip():
        return "must not start or end with whitespace"
    return None if os.path.isabs(value) else "must be an absolute path"


def above_zero(value: float) -> str | None:
    """Refuse 0 and below."""
    return None if value > 0 else "must be above 0"


def read_probe_timeout(r: Table, interval: float) -> float | None:
    """``probe_timeout``: above 0 and below the loop interval (default 80% of it, at most 2s)."""
    timeout = r.duration("probe_timeout", min(2.0, interval * 0.8))
    r.check(
        "probe_timeout",
        timeout,
        lambda v: (
            None if 0 < v < interval else f"must be above 0 and below the interval ({interval:g}s)"
        ),
    )
    return timeout
