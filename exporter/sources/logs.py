"""Engine log sources: a plain log file, journald through systemd-python, or ``journalctl``.

I/O only: each ``sample()`` returns what is new, as read (a file's whole records as one
block of bytes): the core screens, counts and classifies it, and redacts the few lines it
keeps. It never blocks; failures raise ``SourceError`` for ``run_source`` to record.
This is the one module that imports ``systemd.journal``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final, Protocol

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import MAX_RECORD_BYTES, LogBlock, LogReading
from exporter.config import Target
from exporter.sources import TargetSeen, TargetSource

log = logging.getLogger(__name__)

#: Records one ``sample()`` returns at most; a backlog drains over the next ticks, within
#: half the tick's time. A sample is one block of bytes, never split here: the core's block
#: screen rules most of it out in one linear scan, and a flood of 100 MiB drains in seconds.
LINES_PER_SAMPLE: Final = 250_000
#: A first read with no saved position starts at most this far before the end of the file.
MAX_BACKLOG_BYTES: Final = 4 * 2**20
#: Bytes read from a file per ``sample()``, so one call stays bounded.
MAX_READ_BYTES: Final = 32 * 2**20
#: Seconds between saves of a growing log's position.
SAVE_EVERY_SECONDS: Final = 5.0
NO_LOG_FILE_HINT: Final = (
    "the target's log_file does not exist (yet): the engine writes it when it starts; if it "
    "should be there, check the target's log_file"
)
CHUNK_BYTES: Final = 64 * 1024
#: Bytes one read asks a file for: few calls, and nothing per line.
READ_BYTES: Final = 2**20


class LogSource(TargetSource[LogReading], Protocol):
    """What the daemon reads a target's engine log through: a ``TargetSource`` of raw lines."""

    #: Lines one ``sample()`` returns at most.
    max_lines: int


# --- saved positions ------------------------------------------------------------------------


def load_state(path: str | None) -> dict[str, Any]:
    """A small JSON state file's content; {} when it is missing or unreadable."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_state(path: str | None, data: Mapping[str, object]) -> bool:
    """Write a small JSON state file atomically; False (and one DEBUG line) on failure."""
    if not path:
        return True
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("log position not saved path=%s error=%s", path, exc.strerror)
        return False
    return True


# --- plain files ----------------------------------------------------------------------------


def _open_error(exc: OSError) -> SourceError:
    if isinstance(exc, FileNotFoundError):  # nothing to read yet: no data, not a failure
        return SourceAbsent("missing", "log file not found", hint=NO_LOG_FILE_HINT)
    if isinstance(exc, PermissionError):
        return SourceError("permission_denied", "log file not readable")
    if isinstance(exc, IsADirectoryError):
        return SourceError("not_a_file", "log file is a directory")
    return SourceError("read_error", exc.strerror or type(exc).__name__)


class _RecordSplitter:
    r"""Bytes in, whole records out as one bytes object: no object per line.

    ``\n`` ends a line and ``\r`` a progress update; the unterminated tail waits for more
    bytes. A record still unterminated past ``MAX_RECORD_BYTES`` keeps only that much (the
    rest is dropped up to its end), so a writer that never ends a line costs no memory.
    """

    def __init__(self, *, skip_first: bool = False) -> None:
        self.pending = bytearray()
        self.pending_raw = 0
        self.dropping = skip_first
        #: The first record is a fragment (the read began mid-line): it is dropped.
        self.fragment = skip_first

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """The whole records ``data`` completes, and the line ends a dropped fragment took."""
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if not cut:
            self._append(data)
            return b"", 0
        nl, cr = data.find(b"\n", 0, cut), data.find(b"\r", 0, cut)
        first = min(i for i in (nl, cr) if i >= 0)
        self._append(data[:first])
        head, dropped = b"", 0
        if self.fragment:
            dropped = int(data[first] == 0x0A)
        else:
            head = bytes(self.pending) + data[first : first + 1]
        self.pending.clear()
        self.pending_raw, self.dropping, self.fragment = 0, False, False
        self._append(data[cut:])
        return head + data[first + 1 : cut], dropped

    def _append(self, chunk: bytes) -> None:
        self.pending_raw += len(chunk)
        room = 0 if self.dropping else MAX_RECORD_BYTES - len(self.pending)
        self.pending += chunk[: max(room, 0)]
        self.dropping = self.dropping or len(chunk) > room


_RECORD_END: Final = re.compile(rb"[\r\n]")


def _cut_records(data: bytes, most: int) -> int:
    """Where ``data``'s first ``most`` records end (``len(data)`` if it holds no more)."""
    if data.count(b"\n") + data.count(b"\r") <= most:
        return len(data)
    ends = _RECORD_END.finditer(data)  # C speed; only a backlog beyond ``max_lines`` cuts
    return next(itertools.islice(ends, most - 1, None)).end()


def _past(when: float) -> bool:
    return time.monotonic() >= when


def open_regular_file(path: str) -> BinaryIO:
    """Open a log file for reading without ever blocking; refuse what is not a regular file.

    A FIFO would block ``open()`` until a writer comes and every read after it; a device like
    /dev/zero never ends. Both are refused with ``not_regular_file``.

    Raises:
        SourceError: the file cannot be opened, or is not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise _open_error(exc) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SourceError("not_regular_file", f"{path} is not a regular file")
    os.set_blocking(fd, True)  # a regular file never blocks; buffered reads want it plain
    return os.fdopen(fd, "rb")


class FileLogSource:
    """Follows a plain log file across rotation (new inode) and truncation (copytruncate).

    Lines are stamped when read: printed timestamps lack a zone and containers often log UTC.
    """

    name: Final = "logs"

    def __init__(
        self,
        path: str,
        *,
        start_at_end: bool = False,
        offset_file: str | None = None,
        clock: Callable[[], float] = time.time,
        max_lines: int = LINES_PER_SAMPLE,
    ) -> None:
        self.path = path
        self.max_lines = max_lines
        self._start_at_end = start_at_end
        self._offset_file = offset_file
        self._clock = clock
        self._fh: BinaryIO | None = None
        self._identity: tuple[int, int] | None = None
        self._pos = 0
        self._saved: int | None = None
        self._saved_at = -SAVE_EVERY_SECONDS
        self._splitter = _RecordSplitter()
        #: Whole records read but beyond ``max_lines``: the next sample's first.
        self._carry = b""
        self._line_no = 1
        self._behind_since: float | None = None
        #: The file's size at the last look, when it is the file open and not truncated.
        self._seen_size: int | None = None

    @property
    def share_key(self) -> tuple[object, ...]:
        """Targets of one file share one reader (``daemon.shared``).

        Its position is saved in the ``offset_file`` of the target that made it first.
        """
        return ("file", self.path, self._start_at_end, self.max_lines, self._clock)

    def sample(self, deadline: float | None = None, seen: TargetSeen | None = None) -> LogReading:
        """The records appended since the last call, as one block, and how much is left.

        Reads until the end of the file, ``max_lines``, ``MAX_READ_BYTES`` or shortly before
        ``deadline`` (``time.monotonic()``), whichever comes first.
        """
        fh = self._fh or self._open(from_start=False)
        fh = self._follow_rotation(fh)
        if not self._carry and self._seen_size == self._pos:
            self._behind_since = None  # nothing was appended: no read, no fstat (issue 18)
            return LogReading((), 0, None)
        parts, budget, now = [self._carry], MAX_READ_BYTES, self._clock()
        # read for half the time left at most: the rest is the loop's, to classify and publish
        stop_at = float("inf") if deadline is None else (time.monotonic() + deadline) / 2
        at_end = False
        while budget > 0 and not _past(stop_at):
            data = fh.read(min(READ_BYTES, budget))
            if not data:
                at_end = True
                break
            budget -= len(data)
            self._pos += len(data)
            records, dropped = self._splitter.feed(data)
            parts.append(records)
            self._line_no += dropped
        data = b"".join(parts)
        cut = _cut_records(data, self.max_lines)
        data, self._carry = data[:cut], data[cut:]
        block = LogBlock(data, now, self._line_no) if data else None
        self._line_no += data.count(b"\n")
        self._save_position()
        backlog = max(0, os.fstat(fh.fileno()).st_size - self._first_unreturned())
        caught_up = at_end and not self._carry
        if caught_up or not backlog:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = now
        return LogReading((), 0 if caught_up else backlog, self._behind_since, block)

    def close(self) -> None:
        """Save the position and close the file."""
        if self._fh is not None:
            self._save_position(now=True)
            self._fh.close()
            self._fh = None

    def _open(self, *, from_start: bool) -> BinaryIO:
        fh = open_regular_file(self.path)
        st = os.fstat(fh.fileno())
        self._fh, self._identity = fh, (st.st_dev, st.st_ino)
        self._carry = b""
        offset, skip = (0, False) if from_start else self._start_offset(st.st_size)
        self._rewind(fh, offset, skip_first=skip)
        return fh

    def _start_offset(self, size: int) -> tuple[int, bool]:
        """Where a first read begins: the saved offset, the end, or the last few MiB."""
        saved = load_state(self._offset_file)
        same_file = [saved.get("dev"), saved.get("ino")] == list(self._identity or ())
        offset = saved.get("offset")
        if same_file and isinstance(offset, int) and 0 <= offset <= size:
            return offset, False
        if self._start_at_end:
            return size, False
        start = max(0, size - MAX_BACKLOG_BYTES)
        return start, start > 0  # started mid-line: the first record is a fragment

    def _rewind(self, fh: BinaryIO, offset: int, *, skip_first: bool = False) -> None:
        fh.seek(offset)
        self._pos = offset
        self._splitter = _RecordSplitter(skip_first=skip_first)
        self._carry = b""
        self._line_no = 0 if skip_first else 1

    def _follow_rotation(self, fh: BinaryIO) -> BinaryIO:
        """Reopen after a rotation once the old file is drained; rewind after truncation."""
        self._seen_size = None
        try:
            st = os.stat(self.path)
        except OSError:
            return fh  # rotated away and not recreated yet: keep reading the old file
        if (st.st_dev, st.st_ino) != self._identity:
            if self._carry or os.fstat(fh.fileno()).st_size > self._pos:
                return fh  # the old file still has unread lines: drain it first
            log.info("log file rotated path=%s", self.path)
            self.close()
            return self._open(from_start=True)
        if st.st_size < self._pos:
            log.info("log file truncated path=%s", self.path)
            self._rewind(fh, 0)
        else:
            self._seen_size = st.st_size
        return fh

    def _first_unreturned(self) -> int:
        """Offset of the first byte read from the file but not returned as a line yet."""
        return self._pos - self._splitter.pending_raw - len(self._carry)

    def _save_position(self, *, now: bool = False) -> None:
        """Remember the first byte not yet returned, for the next exporter run.

        At most every ``SAVE_EVERY_SECONDS`` while the log grows (a write and a rename a tick
        per target is most of what a busy log costs otherwise), and always on ``close``: a
        crash recounts at most those seconds of lines, a stop none.
        """
        if self._identity is None or not self._offset_file:
            return
        offset = self._first_unreturned()
        if offset == self._saved:
            return
        if not now and time.monotonic() - self._saved_at < SAVE_EVERY_SECONDS:
            return
        dev, ino = self._identity
        if save_state(self._offset_file, {"dev": dev, "ino": ino, "offset": offset}):
            self._saved, self._saved_at = offset, time.monotonic()


# --- factory --------------------------------------------------------------------------------


def make_log_source(target: Target, state_dir: str) -> LogSource | None:
    """The log source a target's config asks for, or None when it names none.

    A log file wins over the journal. Positions are kept in ``state_dir`` so an exporter
    restart neither skips nor recounts lines.
    """
    state = Path(state_dir)
    if target.log_file:
        return FileLogSource(target.log_file, offset_file=str(state / f"{target.name}.logpos"))
    if not (target.journal and target.unit):
        return None
    from exporter.sources.journal import JournalctlLogSource, JournalLogSource, journal_module

    cursor = str(state / f"{target.name}.journal-cursor")
    if journal_module() is not None:
        return JournalLogSource(target.unit, cursor_file=cursor, since=None)
    journalctl = shutil.which("journalctl") or "journalctl"
    return JournalctlLogSource(target.unit, cursor_file=cursor, since=None, journalctl=journalctl)
