"""One tick's log lines made evidence: events of the few that matter, a tally of the rest.

Pure. Lines come one by one (journald's entries) or as one block of bytes (a file): a
block is ruled out in bulk (``core.logblock``) and only the lines its screen flags are
decoded and classified here, so a serving engine's traffic costs a scan, not a step a line.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Final

from exporter.base.model import LogBlock, LogClass, LogEvent, LogTally, RawLogLine
from exporter.core.classify import might_matter
from exporter.core.logblock import BlockScreen, block_lines, decode, line_start_before_end

if TYPE_CHECKING:
    from exporter.core.observe import TargetWorld

#: Lines classified per target per tick before a flood is screened (about 0.1 s of work);
#: lines the classifier's screen rules out are only counted and do not count against it.
CLASSIFY_BUDGET: Final = 1000
#: Plain lines of a tick compared with the line before them, numbers aside, to tell news
#: from a flood of one repeated line.
NEWS_CHECKS: Final = 256
_NUMBERS: Final = re.compile(r"\d+")


def line_key(text: str | bytes) -> str:
    """A line with its numbers blanked: two lines of one flood share it."""
    return _NUMBERS.sub("#", text if isinstance(text, str) else decode(text))


class TickLog:
    """The evidence of one tick's lines, gathered line by line or block by block.

    Past ``budget`` classified lines (a flood of lines the screen cannot rule out) only
    those that may be fatal (``classify.might_matter``, up to ``budget`` more) and the
    newest are classified; the rest are counted by their level, so every line read is
    counted and a fatal line behind tens of MB of noise is seen at once. A line equal to
    the one before it, numbers aside, is a ``repeat``: a flood is weak evidence of progress.
    """

    def __init__(self, world: TargetWorld, *, budget: int, every_line: bool) -> None:
        self.world = world
        self.classifier = world.classifier
        self.events: list[LogEvent] = []
        self.counts: dict[LogClass, int] = {}
        self.news = False
        self._budget = budget
        self._every_line = every_line
        self._classified = 0
        self._checked = 0
        #: The last plain line, whose key is only needed if a classified line follows it.
        self._pending: str | bytes | None = None

    def tally(self) -> LogTally:
        """The counts and the news flag; the last plain line becomes the world's last."""
        if self._pending is not None:
            self.world.last_line_key, self._pending = line_key(self._pending), None
        return LogTally(tuple(self.counts.items()), self.news)

    def lines(self, lines: tuple[RawLogLine, ...]) -> None:
        """Lines read one by one, in order."""
        newest = len(lines) - self._budget // 2
        for i, line in enumerate(lines):
            self.line(line.text, line.at, line.line_no, newest=i >= newest)

    def block(self, block: LogBlock) -> None:
        """A block of records: bulk-counted but for the lines its screen flags."""
        screen = self.classifier.block
        if screen is None or self._every_line:
            self.lines(block_lines(block))
            return
        data, newest = block.data, -1

        def plain(start: int, stop: int) -> None:
            self._bulk(screen, data, start, stop)

        tracing = lambda: self.classifier.in_traceback  # noqa: E731 (read at each record)
        for text, line_no, offset in screen.walk(data, block.first_line_no, tracing, plain):
            if newest < 0 and self._classified >= self._budget:
                newest = line_start_before_end(data, 0, len(data), self._budget // 2)
            self.line(text, block.at, line_no, newest=0 <= newest <= offset)

    def line(self, text: str, at: float, line_no: int | None, *, newest: bool) -> None:
        """One line: counted when plain, else classified into events."""
        classifier = self.classifier
        cls = None if self._every_line else classifier.plain(text)
        flooded = cls is None and self._classified >= self._budget and not newest
        if flooded and (self._classified >= 2 * self._budget or not might_matter(text)):
            cls = classifier.level_class(text)
        if cls is not None:
            self.counts[cls] = self.counts.get(cls, 0) + 1
            if cls is not LogClass.BENIGN:
                self._check_news(text)
            else:
                self._pending = text
            return
        if self._pending is not None:
            self.world.last_line_key, self._pending = line_key(self._pending), None
        self._classified += 1
        for event in classifier.classify(text, at=at, line_no=line_no, line_time=False):
            self.events.append(self._mark_repeat(event))

    def _check_news(self, text: str | bytes) -> None:
        """Whether this plain line differs from the one before it (a few lines a tick)."""
        if self.news or self._checked >= NEWS_CHECKS:
            self._pending = text
            return
        self._checked += 1
        world = self.world
        before = line_key(self._pending) if self._pending is not None else world.last_line_key
        world.last_line_key, self._pending = line_key(text), None
        self.news = world.last_line_key != before

    def _bulk(self, screen: BlockScreen, data: bytes, start: int, stop: int) -> None:
        """Whole lines no pattern can match: access lines are benign, the others info."""

        def info(a: int, b: int) -> None:
            if a > start:  # an access line before it: the line it is compared with
                self._pending = data[line_start_before_end(data, start, a, 1) : a - 1]
            self._info_lines(data, a, b)

        looking = not self.news and self._checked < NEWS_CHECKS
        counts = screen.plain_counts(data, start, stop, info if looking else None)
        for cls, n in zip((LogClass.INFO, LogClass.BENIGN), counts, strict=True):
            if n:
                self.counts[cls] = self.counts.get(cls, 0) + n
        self._pending = data[line_start_before_end(data, start, stop, 1) : stop - 1]

    def _info_lines(self, data: bytes, start: int, stop: int) -> None:
        """Look for news among the first info lines of ``data[start:stop]``, if still looking."""
        pos = start
        while pos < stop and not self.news and self._checked < NEWS_CHECKS:
            nl = data.find(b"\n", pos, stop)
            self._check_news(data[pos:nl])
            pos = nl + 1

    def _mark_repeat(self, event: LogEvent) -> LogEvent:
        key = line_key(event.text)
        repeat = key == self.world.last_line_key
        self.world.last_line_key = key
        return dataclasses.replace(event, repeat=True) if repeat else event
