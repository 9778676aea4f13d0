r"""Block screens: a tick's log bytes ruled out in one linear scan, not line by line.

No I/O. A serving engine logs every request; a monitor must cost nothing for a line that
matters to no one. So a file's new bytes arrive as one ``LogBlock`` and two RE2 regexes
(linear in the input, whatever it holds) walk them in C:

- the *flag* regex is every pattern a classifier screens lines with, as one multi-line
  alternation: a line it does not hit is plain (``INFO``) without being split, decoded or
  looked at again; only the lines it hits are cut out and classified one by one;
- the *access* regex matches runs of consecutive request access lines (``engines.access``),
  which are counted as request traffic (``BENIGN``) by the bytes they span.

Where flagged lines come back to back (a start-up log: most of its lines matter), a search
a line costs more than the classifier's own check, so the walk hands the next lines over one
by one for a stretch (``DENSE_RUNS``, ``DENSE_LINES``) before it searches again.

Both are screens, as ``core.screen``'s sets are: a flagged line still goes through
``LogClassifier.plain`` first, so a regex that reads a little widely (``\s`` crossing a
line end) costs a check, never a verdict.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import re2

from exporter.base.model import MAX_RECORD_BYTES, LogBlock, LogReading, RawLogLine

#: RE2's memory for one compiled block regex: the profiles' alternations take a few MiB of
#: DFA states; a tight budget would make RE2 fall back to its slower NFA.
_MAX_MEM: Final = 256 << 20
#: Besides the classifier's patterns, a line is flagged when it is blank (``classify``
#: skips it: it is not counted) or holds an octal-escaped colour code (journald's export).
_BLOCK_EXTRAS: Final = (r"^[ \t]*\n", r"#033\[")

#: Flagged runs found back to back after which ``BlockScreen.walk`` hands over the next
#: ``DENSE_LINES`` lines without searching them.
DENSE_RUNS: Final = 2
DENSE_LINES: Final = 16
#: One RE2 search: (anchor, text, pos, endpos) -> spans of the groups (group 0 first).
_Search = Callable[[object, bytes, int, int], list[tuple[int, int]]]
_UNANCHORED: Final = re2._Anchor.UNANCHORED  # the raw binding's search modes
_ANCHORED: Final = re2._Anchor.ANCHOR_START


@dataclass(frozen=True, slots=True)
class BlockScreen:
    """The two compiled block regexes of one classifier (``block_screen``)."""

    _flag: _Search
    #: None without an access family: no line is counted as a request.
    _access: _Search | None

    def next_flagged(self, data: bytes, pos: int, end: int) -> tuple[int, int] | None:
        """The first run of flagged lines at or after ``pos``: (its first byte, past its end).

        The run starts at the start of the line the hit begins in and ends after the end of
        the line the hit ends in (a hit may cross line ends: each line it touches is
        flagged). None when nothing in ``data[pos:end]`` is flagged.
        """
        start, stop = self._flag(_UNANCHORED, data, pos, end)[0]
        if start < 0:
            return None
        first = data.rfind(b"\n", pos, start) + 1 or pos
        last = data.find(b"\n", max(start, stop - 1), end)
        return max(first, pos), end if last < 0 else last + 1

    def access_runs(self, data: bytes, pos: int, end: int) -> Iterator[tuple[int, int]]:
        """Each run of consecutive whole access lines in ``data[pos:end]``: (start, end)."""
        while self._access is not None and pos < end:
            # Anchored first: serving traffic starts a run where the last one stopped, and an
            # anchored search skips the reverse scan that finds an unanchored match's start.
            start, stop = self._access(_ANCHORED, data, pos, end)[0]
            if start < 0:
                start, stop = self._access(_UNANCHORED, data, pos, end)[0]
            if start < 0:
                return
            yield start, stop
            pos = stop

    def walk(
        self,
        data: bytes,
        line_no: int | None,
        tracing: Callable[[], bool],
        plain: Callable[[int, int], None],
        *,
        redraws: bool = True,
    ) -> Iterator[tuple[str, int | None, int]]:
        r"""Each flagged record of ``data``: (its text, its line number, its offset).

        ``plain(start, stop)`` is called for each run of whole lines between them, in
        order. While ``tracing()`` (a traceback is open: the caller classified its head
        between two records) every line is a record, until it ends. ``redraws=False``
        keeps a line's ``\r`` updates in one record, for a caller that splits them itself.
        """
        pos, end = 0, len(data)
        # Lines still to hand over one by one: flagged lines came back to back, and a search
        # a line costs more there than the caller's own check of each line (start-up logs).
        one_by_one = back_to_back = 0
        while pos < end:
            if one_by_one or tracing():
                one_by_one = max(0, one_by_one - 1)
                nl = data.find(b"\n", pos, end)
                run: tuple[int, int] | None = (pos, end if nl < 0 else nl + 1)
            else:
                run = self.next_flagged(data, pos, end)
                back_to_back = back_to_back + 1 if run is not None and run[0] == pos else 0
                if back_to_back >= DENSE_RUNS:
                    one_by_one, back_to_back = DENSE_LINES, 0
            start, stop = run or (end, end)
            if start > pos:
                plain(pos, start)
                if line_no is not None:
                    line_no += data.count(b"\n", pos, start)
            if run is None:
                return
            for record, ends_line, offset in records(data, start, stop, redraws=redraws):
                yield decode(record), line_no, offset
                if line_no is not None:
                    line_no += ends_line
            pos = stop

    def plain_counts(
        self, data: bytes, start: int, stop: int, info: Callable[[int, int], None] | None = None
    ) -> tuple[int, int]:
        """Info and access lines in whole plain lines ``data[start:stop]``.

        ``info(a, b)`` is called for each run of info lines between the access runs.
        """
        benign, pos = 0, start
        for run_start, run_stop in self.access_runs(data, start, stop):
            if info is not None and run_start > pos:
                info(pos, run_start)
            benign += data.count(b"\n", run_start, run_stop)
            pos = run_stop
        if info is not None and stop > pos:
            info(pos, stop)
        return data.count(b"\n", start, stop) - benign, benign


def block_screen(flag_regexes: Iterable[str], access_regexes: Iterable[str]) -> BlockScreen | None:
    """The block screen of a classifier's screen regexes and the access family's.

    One per distinct pair of lists, shared (a classifier is made per target and per
    engine process). None when a regex is not RE2's: the caller then reads line by line.
    """
    return _compiled(tuple(flag_regexes), tuple(access_regexes))


@functools.cache
def _compiled(flag: tuple[str, ...], access: tuple[str, ...]) -> BlockScreen | None:
    options = re2.Options()
    options.case_sensitive = False
    options.never_capture = True  # only where a hit is matters; profiles reuse group names
    options.max_mem = _MAX_MEM
    alternation = "|".join(f"(?:{r})" for r in (*flag, *_BLOCK_EXTRAS))
    # A run of whole lines, each holding an access line's shape somewhere.
    family = "|".join(f"(?:{r})" for r in access)
    runs = rf"(?:^[^\n]*?(?:{family})[^\n]*\n)+"
    try:
        flag_re = re2.compile(f"(?m){alternation}".encode(), options)
        access_re = re2.compile(f"(?m){runs}".encode(), options) if access else None
    except re2.error:
        return None
    # The binding's own search, past the wrapper's per-call Python (this runs per block).
    return BlockScreen(flag_re._regexp.Match, access_re._regexp.Match if access_re else None)


def records(
    data: bytes, start: int, end: int, *, redraws: bool = True
) -> Iterator[tuple[bytes, bool, int]]:
    r"""The records of ``data[start:end]``, capped: (bytes, ends a line with ``\n``, offset).

    ``\r`` ends a record too (a progress redraw), which does not end the line, unless
    ``redraws`` is False: the line is then whole, uncapped, for the caller to split.
    """
    pos = start
    while pos < end:
        nl = data.find(b"\n", pos, end)
        cr = data.find(b"\r", pos, end if nl < 0 else nl) if redraws else -1
        stop = cr if cr >= 0 else (nl if nl >= 0 else end)
        cap = stop if not redraws else min(stop, pos + MAX_RECORD_BYTES)
        yield data[pos:cap], stop == nl, pos
        pos = stop + 1


def decode(record: bytes) -> str:
    """A record's text: invalid UTF-8 replaced, never raised."""
    return record.decode("utf-8", errors="replace")


def block_lines(block: LogBlock) -> tuple[RawLogLine, ...]:
    """Every record of a block as a ``RawLogLine``, numbered: for showing each line."""
    line_no, out = block.first_line_no, []
    for record, ends_line, _ in records(block.data, 0, len(block.data)):
        out.append(RawLogLine(decode(record), block.at, line_no))
        if line_no is not None:
            line_no += ends_line
    return tuple(out)


def line_start_before_end(data: bytes, start: int, end: int, count: int) -> int:
    """Where the last ``count`` lines of ``data[start:end]`` begin (``start`` if fewer)."""
    pos = end - 1  # the last line's own terminator is not a line start
    for _ in range(count):
        pos = data.rfind(b"\n", start, pos)
        if pos < 0:
            return start
    return pos + 1


def reading_lines(reading: LogReading) -> tuple[RawLogLine, ...]:
    """Every line a reading holds, its block's records included, in the log's order."""
    block = () if reading.block is None else block_lines(reading.block)
    return (*reading.lines, *block)
