"""Pattern screens: RE2 sets that rule most lines out in time linear in the line.

No I/O. ``re`` decides every hit in the patterns' own order; the set only says which
patterns can occur in a line, so a profile of forty patterns costs one scan a line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from exporter.base.linear import Screen, screen_of
from exporter.engines.profile import LogPattern

__all__ = ["PatternSet", "Screen", "screen_of"]


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
