"""User-supplied regular expressions, compiled with RE2 so matching stays linear in the text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, cast

import re2


class _Re2Pattern(Protocol):
    """What this module uses of a compiled ``re2`` pattern (the package ships no types)."""

    def search(self, text: str) -> object | None:
        """A match object or None."""
        ...


@dataclass(frozen=True, slots=True)
class UserRegex:
    """A regular expression from the config, compiled with RE2: matching is linear in the text.

    Python's ``re`` backtracks: ``(a+)+$`` against one long line of ``a`` holds the GIL for
    minutes, stopping scrapes and ``/-/healthy`` with the loop. RE2 has no backtracking, so
    it refuses what needs it (backreferences, lookarounds, possessive and atomic groups).
    Equal when the pattern and flags are (a reload compares targets).

    Raises:
        ValueError: with the reason, when RE2 cannot take the pattern.
    """

    pattern: str
    ignore_case: bool = False
    _compiled: _Re2Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        options = re2.Options()
        options.case_sensitive = not self.ignore_case
        options.log_errors = False  # RE2 would print each refusal to stderr itself
        try:
            compiled = re2.compile(self.pattern, options)
        except re2.error as exc:
            raise ValueError(_re2_refusal(self.pattern, exc)) from None
        object.__setattr__(self, "_compiled", cast(_Re2Pattern, compiled))

    def search(self, text: str) -> object | None:
        """A match object when the pattern occurs anywhere in text, else None."""
        return self._compiled.search(text)


def _re2_refusal(pattern: str, exc: Exception) -> str:
    why = exc.args[0] if exc.args else ""
    reason = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
    try:
        re.compile(pattern)
    except re.error as syntax:  # a plain mistake: Python's message says where
        return f"is not a valid regular expression: {syntax}"
    return (
        "needs backtracking (a backreference, lookaround, possessive or atomic group), refused: "
        f"one hostile line could freeze the exporter; RE2: {reason}"
    )


def check_regex(value: str, *, ignore_case: bool = True) -> str | None:
    """Why RE2 refuses ``value`` as a pattern, or None."""
    try:
        UserRegex(value, ignore_case)
    except ValueError as exc:
        return str(exc)
    return None
