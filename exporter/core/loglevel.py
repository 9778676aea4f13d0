"""A log line's own level: the severity its level field states, and the class that gives it.

No I/O. Engines print their levels in many shapes (glog letters, bracketed letters, words,
``level=`` fields); ``exporter.core.classify`` asks here what a line says of itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import re2

from exporter.base.model import LogClass

#: Where a line's own level field is sought: after timestamps, pids and rank prefixes.
_LEVEL_WINDOW: Final = 120
# The line's own level field, whichever comes first: glog "E0416 14:45:07" (triton-04-crash),
# llama.cpp "0.00.174.294 E" (llamacpp-09-crash), "[E]"/"[E ProcessGroupNCCL" (trtllm-03,
# tgi-04), upper-case words ("ERROR 02-23", "NCCL WARN"), and any-case fields: "level=error"
# (ollama-01-ready), '"level":"ERROR"' (tgi-13-crash), "[error]" (mindie-01-nccl), "error:"
# (triton-03-crash). "NCCL_DEBUG=INFO" is a setting, not a level.
_LEVEL = re.compile(
    r"(?:^|\s)(?P<glog>[IWEF])\d{4} \d\d:\d\d:\d\d"
    r"|^\d+\.\d\d\.\d{3}\.\d{3} (?P<letter>[IWEDT]) "
    r"|\[(?P<bracket>[IWEDF])(?:\]| \w)"
    r"|(?<![=/])\b(?P<word>TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|CRITICAL|FATAL|PANIC)\b"
    r"|(?:(?i:level)\s*[=:]\s*\"?|\"(?i:level)\"\s*:\s*\"|\[|^|<)"
    r"(?P<field>(?i:trace|debug|info|notice|warn(?:ing)?|error|err|critical|fatal))"
    r"(?:\]|\"|\s*:|>|\s|$)"
)
#: ``_LEVEL`` as RE2 reads it, in time linear in the line: without its look-behind and with
#: ``re``'s ASCII whitespace (RE2's ``\s`` leaves out \v and \x1c-\x1f), so on ASCII text
#: it matches wherever ``re`` does, and perhaps earlier. ``re`` then searches only from its
#: match on: the alternation costs ``re`` a try at every position of the window.
_FINDER_PATTERN: Final = _LEVEL.pattern.replace("(?<![=/])", "").replace(
    r"\s", r"[\t-\r\x1c-\x1f ]"
)


def _finder() -> Callable[[object, bytes, int, int], list[tuple[int, int]]] | None:
    options = re2.Options()
    options.never_capture = True  # only where a match starts matters
    try:
        return re2.compile(_FINDER_PATTERN, options)._regexp.Match  # type: ignore[no-any-return]
    except re2.error:
        return None


_FIND: Final = _finder()
_UNANCHORED: Final = re2._Anchor.UNANCHORED
_LEVELS: Final[dict[str, int]] = {
    "t": 10,
    "d": 10,
    "i": 20,
    "n": 20,
    "w": 30,
    "e": 40,
    "c": 50,
    "f": 50,
    "p": 50,
}
#: Severities of ``line_level``: info, warning, error.
INFO: Final = 20
WARNING: Final = 30
ERROR: Final = 40
#: A level of warning or worse in any of ``line_level``'s shapes, and exception and warning
#: lines, as regexes for a screen: a superset ("err" in "stderr" only costs a check).
LEVEL_SCREEN: Final = (
    r"warn|err|crit|fatal|panic|exception|traceback",
    r"(?:^|\s)[WEF]\d{4} \d\d:\d\d:\d\d",
    r"^\d+\.\d\d\.\d{3}\.\d{3} [WE] ",
    r"\[[WEF](?:\]| \w)",
)
_EXCEPTION_LINE = re.compile(r"^[\w.]*(?:Error|Exception): ")
_WARNING_LINE = re.compile(r"\w+Warning: ")


def line_level(text: str) -> int | None:
    """The severity the line's own level field states (10 debug .. 50 fatal), or None.

    Case-insensitive where the field is delimited (``level=error``, ``[error]``, ``error:``);
    a bare word counts only in capitals, so prose ("an error occurred") is not a level.
    """
    window = text[:_LEVEL_WINDOW]
    start = 0
    if _FIND is not None and window.isascii():
        start = _FIND(_UNANCHORED, window.encode(), 0, len(window))[0][0]
        if start < 0:
            return None
    m = _LEVEL.search(window, start)
    if m is None:
        return None
    return _LEVELS[next(g for g in m.groups() if g).lower()[0]]


def level_class(text: str) -> LogClass:
    """The class a line's own level gives it: error, warning or info.

    A line without a level field is an error when it is an exception line
    (``ValueError: ...``), a warning when a ``...Warning:`` is in it, info otherwise.
    """
    level = line_level(text)
    if level is None:
        # The literals first: ``\w+`` before them costs ``re`` a try at every word.
        if ("Error: " in text or "Exception: " in text) and _EXCEPTION_LINE.search(text):
            return LogClass.ERROR
        warned = "Warning: " in text and _WARNING_LINE.search(text)
        return LogClass.WARNING if warned else LogClass.INFO
    if level >= ERROR:
        return LogClass.ERROR
    return LogClass.WARNING if level >= WARNING else LogClass.INFO
