"""Pattern screens: RE2 sets that rule most lines out in time linear in the line.

No I/O. ``re`` decides every hit in the patterns' own order; the set only says which
patterns can occur in a line, so a profile of forty patterns costs one scan a line.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Protocol

import re2

from exporter.engines.profile import LogPattern


class Screen(Protocol):
    """What this module uses of an ``re2.Set`` (the package ships no types)."""

    def Match(self, text: bytes) -> list[int] | None:
        """The indices of the patterns that occur in text, or None."""
        ...


def screen_of(regexes: Iterable[str]) -> Screen | None:
    """``_compiled_screen`` of the regexes: one set per distinct list, shared."""
    return _compiled_screen(tuple(regexes))


@functools.cache
def _compiled_screen(regexes: tuple[str, ...]) -> Screen | None:
    r"""One RE2 set of the regexes, case-insensitive, searched in time linear in the line.

    A screen: ``re`` still decides each hit, so a pattern RE2 reads a little more widely
    costs a check, never a verdict. RE2's ``\w``, ``\d`` and ``\b`` are ASCII: the profiles'
    patterns name ASCII words, which both engines read alike. None when a regex is not
    RE2's (the engine profiles' are all checked to be, by a test).

    """
    options = re2.Options()
    options.case_sensitive = False
    options.max_mem = 64 << 20  # the profiles' sets take a few MiB; the default 8 MiB is tight
    screen = re2.Set.SearchSet(options)
    try:
        for regex in regexes:
            screen.Add(regex)
        screen.Compile()
    except re2.error:
        return None
    return screen  # type: ignore[no-any-return]


class PatternSet:
    """Patterns checked in order, behind one RE2 set that rules most lines out at once.

    Only the patterns the set says occur in a line are searched with ``re``, in order.
    """

    def __init__(self, patterns: Iterable[LogPattern]) -> None:
        self.patterns = tuple(patterns)
        self._screen = screen_of(p.regex.pattern for p in self.patterns)

    def first(
        self, text: str, hits: Sequence[int] | None = None, offset: int = 0
    ) -> tuple[LogPattern, re.Match[str]] | None:
        """The first pattern (in order) that matches, with its match.

        ``hits``: a wider screen's sorted hits on the same text, in which this set's
        patterns are ``offset`` on; used in place of this set's own screen, so a line is
        scanned once for every layer of a classifier.
        """
        if not self.patterns:
            return None
        candidates: Iterable[int]
        if hits is not None:
            end = offset + len(self.patterns)
            candidates = [i - offset for i in hits if offset <= i < end]
        elif self._screen is None:
            candidates = range(len(self.patterns))
        else:
            hits = self._screen.Match(text.encode("utf-8", "surrogatepass"))
            if not hits:
                return None
            candidates = sorted(hits)
        for i in candidates:
            p = self.patterns[i]
            if m := p.regex.search(text):
                return p, m
        return None
