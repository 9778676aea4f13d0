"""Engine log sources: a plain log file, journald through systemd-python, or ``journalctl``.

I/O only: each ``sample()`` returns the lines that are new, as read: the core screens,
counts and classifies them, and redacts the few it keeps. It never blocks; failures raise
``SourceError`` for ``run_source`` to record.
This is the one module that imports ``systemd.journal``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import shutil
import stat
import struct
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, Final, Protocol, cast

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import LogReading, RawLogLine
from exporter.config import Target
from exporter.sources import TargetSeen, TargetSource


@functools.cache
def _journal() -> ModuleType | None:
    """systemd-python's journal module, or None (the journalctl fallback serves then).

    Imported on first use: its native libraries cost about 2.6 MiB of RSS, which a daemon
    reading only log files should not pay (issue 18).
    """
    try:
        from systemd import journal
    except ImportError:  # pragma: no cover - exercised on hosts without the package
        return None
    return cast(ModuleType, journal)  # untyped C binding


log = logging.getLogger(__name__)

#: Lines one ``sample()`` returns at most; a backlog drains over the next ticks, within
#: half the tick's time. Reading is cheap (about a µs a line), and so is a line the core's
#: screen rules out: a flood of 50 MiB drains in a few ticks.
LINES_PER_SAMPLE: Final = 250_000
#: Longest line kept; the rest of a longer line is dropped (the classifier caps text too).
MAX_LINE_BYTES: Final = 8192
#: A first read with no saved position starts at most this far before the end of the file.
MAX_BACKLOG_BYTES: Final = 4 * 2**20
#: Bytes read from a file per ``sample()``, so one call stays bounded.
MAX_READ_BYTES: Final = 32 * 2**20
#: Entries ``journalctl`` shows from before the exporter started, when no cursor is saved.
JOURNALCTL_BACKLOG_LINES: Final = 2000
SYSTEM_JOURNAL_DIRS: Final = ("/var/log/journal", "/run/log/journal")
NO_LOG_FILE_HINT: Final = (
    "the target's log_file does not exist (yet): the engine writes it when it starts; if it "
    "should be there, check the target's log_file"
)
NO_JOURNAL_HINT: Final = (
    "no systemd journal on this host (/var/log/journal, /run/log/journal): set journal = false "
    "and a log_file in the target, or mount the journal into the exporter's container"
)
_JOURNAL_MAGIC: Final = b"LPKSHHRH"
_CHUNK: Final = 64 * 1024


class LogSource(TargetSource[LogReading], Protocol):
    """What the daemon reads a target's engine log through: a ``TargetSource`` of raw lines."""

    #: Lines one ``sample()`` returns at most.
    max_lines: int


# --- saved positions ------------------------------------------------------------------------


def _load_state(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_state(path: str | None, data: Mapping[str, object]) -> bool:
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


@dataclass(frozen=True, slots=True)
class _Record:
    """One complete record: the line (capped) and how many raw bytes it took in the file."""

    data: bytes
    ends_line: bool
    raw_len: int


_RECORD_END: Final = re.compile(rb"[\r\n]")


class _LineSplitter:
    r"""Bytes in, complete records out: ``\n`` ends a line, ``\r`` ends a progress update.

    A record longer than ``MAX_LINE_BYTES`` is cut there and the rest dropped up to its end.
    """

    def __init__(self, *, skip_first: bool = False) -> None:
        self.pending = bytearray()
        self.pending_raw = 0
        self.dropping = skip_first

    def feed(self, data: bytes) -> list[_Record]:
        """Complete records in ``data``; the unterminated tail waits for more bytes."""
        if b"\r" not in data:
            return self._feed_lines(data)
        out: list[_Record] = []
        start = 0
        for end in _RECORD_END.finditer(data):  # C speed: a flood is tens of MB
            i = end.start()
            self._append(data[start:i])
            out.append(_Record(bytes(self.pending), data[i] == 0x0A, self.pending_raw + 1))
            self.pending.clear()
            self.pending_raw, self.dropping, start = 0, False, i + 1
        self._append(data[start:])
        return out

    def _feed_lines(self, data: bytes) -> list[_Record]:
        """``feed`` for bytes without carriage returns: one C split, a loop that only wraps."""
        *lines, tail = data.split(b"\n")
        if not lines:
            self._append(tail)
            return []
        self._append(lines[0])
        out = [_Record(bytes(self.pending), True, self.pending_raw + 1)]
        self.pending.clear()
        self.pending_raw, self.dropping = 0, False
        cap = MAX_LINE_BYTES
        out += [_Record(ln[:cap], True, len(ln) + 1) for ln in lines[1:]]
        self._append(tail)
        return out

    def _append(self, chunk: bytes) -> None:

        self.pending_raw += len(chunk)
        room = 0 if self.dropping else MAX_LINE_BYTES - len(self.pending)
        self.pending += chunk[: max(room, 0)]
        self.dropping = self.dropping or len(chunk) > room


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
        self._splitter = _LineSplitter()
        self._records: deque[_Record] = deque()
        self._line_no = 1
        self._behind_since: float | None = None
        #: The file's size at the last look, when it is the file open and not truncated.
        self._seen_size: int | None = None

    def sample(self, deadline: float | None = None, seen: TargetSeen | None = None) -> LogReading:
        """The lines appended since the last call, and how much is left behind.

        Reads until the end of the file, ``max_lines``, ``MAX_READ_BYTES`` or shortly before
        ``deadline`` (``time.monotonic()``), whichever comes first.
        """
        fh = self._fh or self._open(from_start=False)
        fh = self._follow_rotation(fh)
        if not self._records and self._seen_size == self._pos:
            self._behind_since = None  # nothing was appended: no read, no fstat (issue 18)
            return LogReading((), 0, None)
        lines: list[RawLogLine] = []
        budget = MAX_READ_BYTES
        now = self._clock()
        # read for half the time left at most: the rest is the loop's, to classify and publish
        stop_at = float("inf") if deadline is None else (time.monotonic() + deadline) / 2
        at_end = False
        while len(lines) < self.max_lines and not (len(lines) % 1024 == 1023 and _past(stop_at)):
            if not self._records:
                data = fh.read(min(_CHUNK, budget))
                if not data:
                    at_end = budget > 0
                    break
                budget -= len(data)
                self._pos += len(data)
                self._records.extend(self._splitter.feed(data))
                continue
            record = self._records.popleft()
            lines.append(
                RawLogLine(record.data.decode("utf-8", errors="replace"), now, self._line_no)
            )
            self._line_no += record.ends_line
        self._save_position()
        backlog = max(0, os.fstat(fh.fileno()).st_size - self._first_unreturned())
        if at_end or not backlog:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = now
        return LogReading(tuple(lines), backlog if not at_end else 0, self._behind_since)

    def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self, *, from_start: bool) -> BinaryIO:
        fh = open_regular_file(self.path)
        st = os.fstat(fh.fileno())
        self._fh, self._identity = fh, (st.st_dev, st.st_ino)
        self._records.clear()
        offset, skip = (0, False) if from_start else self._start_offset(st.st_size)
        self._rewind(fh, offset, skip_first=skip)
        return fh

    def _start_offset(self, size: int) -> tuple[int, bool]:
        """Where a first read begins: the saved offset, the end, or the last few MiB."""
        saved = _load_state(self._offset_file)
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
        self._splitter = _LineSplitter(skip_first=skip_first)
        self._line_no = 0 if skip_first else 1

    def _follow_rotation(self, fh: BinaryIO) -> BinaryIO:
        """Reopen after a rotation once the old file is drained; rewind after truncation."""
        self._seen_size = None
        try:
            st = os.stat(self.path)
        except OSError:
            return fh  # rotated away and not recreated yet: keep reading the old file
        if (st.st_dev, st.st_ino) != self._identity:
            if self._records or os.fstat(fh.fileno()).st_size > self._pos:
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
        unread = self._splitter.pending_raw + sum(r.raw_len for r in self._records)
        return self._pos - unread

    def _save_position(self) -> None:
        """Remember the first byte not yet returned, for the next exporter run."""
        if self._identity is None:
            return
        offset = self._first_unreturned()
        if offset == self._saved:
            return
        dev, ino = self._identity
        if _save_state(self._offset_file, {"dev": dev, "ino": ino, "offset": offset}):
            self._saved = offset


# --- journald -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalFiles:
    """What a look at the journal directories found."""

    readable: tuple[str, ...]
    unreadable: tuple[str, ...]
    corrupt: tuple[str, ...]


def _journal_files(dirs: Iterable[str]) -> Iterable[str]:
    for d in dirs:
        for root, subdirs, files in os.walk(d, onerror=_raise):
            subdirs[:] = [s for s in subdirs if not s.startswith(".")]
            for name in files:
                if name.endswith((".journal", ".journal~")):
                    yield os.path.join(root, name)


def _raise(exc: OSError) -> None:
    raise exc


def _header_ok(path: str) -> bool:
    """A journal file's header is intact and the file is as long as the header says."""
    with open(path, "rb") as fh:
        head = fh.read(104)
        size = os.fstat(fh.fileno()).st_size
    if len(head) < 104 or head[:8] != _JOURNAL_MAGIC:
        return False
    header_size, arena_size = struct.unpack_from("<QQ", head, 88)
    return bool(size >= header_size + arena_size)


def inspect_journal(dirs: Iterable[str]) -> JournalFiles:
    """Check journal files ourselves: python-systemd silently skips unreadable or corrupt ones.

    Raises:
        SourceAbsent: ``missing`` when no directory exists (a host without a journal).
        SourceError: ``permission_denied`` when one cannot be listed.
    """
    existing = [d for d in dirs if os.path.isdir(d)]
    if not existing:
        raise SourceAbsent("missing", "no journal directory", hint=NO_JOURNAL_HINT)
    readable: list[str] = []
    unreadable: list[str] = []
    corrupt: list[str] = []
    try:
        paths = sorted(_journal_files(existing))
    except PermissionError as exc:
        raise SourceError("permission_denied", "journal directory not readable") from exc
    for path in paths:
        try:
            (readable if _header_ok(path) else corrupt).append(path)
        except PermissionError:
            unreadable.append(path)
        except OSError:
            corrupt.append(path)
    return JournalFiles(tuple(readable), tuple(unreadable), tuple(corrupt))


def check_journal(dirs: Iterable[str], seen_corrupt: set[str]) -> JournalFiles:
    """``inspect_journal`` plus the verdict: unreadable system files make the source fail.

    User journals (``user-*.journal``) are skipped: services log to the system journal.
    """
    files = inspect_journal(dirs)
    blocked = [p for p in files.unreadable if not os.path.basename(p).startswith("user-")]
    if blocked:
        raise SourceError("permission_denied", f"{len(blocked)} journal files not readable")
    for path in sorted(set(files.corrupt) - seen_corrupt):
        log.warning("journal file corrupt, skipped path=%s", path)
        seen_corrupt.add(path)
    if files.corrupt and not files.readable:
        raise SourceError("corrupt", "no intact journal file")
    return files


def unit_name(unit: str) -> str:
    """``vllm`` -> ``vllm.service``; names with a unit suffix stay as they are."""
    return unit if "." in unit else f"{unit}.service"


def _message_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):  # journalctl JSON writes non-UTF-8 messages as byte arrays
        return bytes(b & 0xFF for b in value if isinstance(b, int)).decode(
            "utf-8", errors="replace"
        )
    return "" if value is None else str(value)


def _realtime(value: object, fallback: float) -> float:
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return int(str(value)) / 1e6
    except ValueError:
        return fallback


class _JournalFollower:
    """What both journal readers share: unit, cursor and the file checks."""

    name: Final = "logs"

    def __init__(
        self,
        unit: str,
        *,
        cursor_file: str | None,
        since: float | None,
        journal_dir: str | None = None,
        max_lines: int = LINES_PER_SAMPLE,
    ) -> None:
        self.unit = unit_name(unit)
        self.max_lines = max_lines
        self._cursor_file = cursor_file
        self._since = since
        self._journal_dir = journal_dir
        self._dirs = (journal_dir,) if journal_dir else SYSTEM_JOURNAL_DIRS
        saved = _load_state(cursor_file)
        cursor = saved.get("cursor") if saved.get("unit") == self.unit else None
        self._cursor: str | None = cursor if isinstance(cursor, str) else None
        self._seen_corrupt: set[str] = set()
        #: Journal files found corrupt (and skipped) at the last check.
        self.corrupt_files: tuple[str, ...] = ()

    def sample(self, deadline: float | None = None, seen: TargetSeen | None = None) -> LogReading:
        """The unit's entries written since the last call (at most ``max_lines``)."""
        self._prepare()
        lines: list[RawLogLine] = []
        last = self._cursor
        while len(lines) < self.max_lines:
            entry = self._next_entry()
            if entry is None:
                break
            at = _realtime(entry.get("__REALTIME_TIMESTAMP"), time.time())
            lines.append(RawLogLine(_message_text(entry.get("MESSAGE")), at))

            last = str(entry.get("__CURSOR", last))
        if last != self._cursor and last is not None:
            self._cursor = last
            _save_state(self._cursor_file, {"unit": self.unit, "cursor": last})
        self._finish(got_entries=bool(lines))
        return LogReading(tuple(lines))

    def _check_files(self) -> None:
        self.corrupt_files = check_journal(self._dirs, self._seen_corrupt).corrupt

    def _prepare(self) -> None:
        """Open (or reopen) the journal before reading."""

    def _next_entry(self) -> Mapping[str, object] | None:
        """The next entry of the unit, or None when there is none yet."""
        return None

    def _finish(self, *, got_entries: bool) -> None:
        """Called after each read."""


class JournalLogSource(_JournalFollower):
    """Follows one systemd unit's journal entries through systemd-python.

    Starts at the saved cursor, else at ``since``, else at the first entry of the unit's
    latest invocation; saves the cursor after every read so an exporter restart counts
    nothing twice. Rotation is followed through the reader's inotify descriptor.
    """

    #: The systemd-python reader, opened on the first ``sample()`` (an untyped C binding).
    _reader: Any = None
    #: ``systemd.journal``, set when the reader is opened (untyped too).
    _module: Any = None
    #: An entry read ahead of its turn, returned by the next ``_next_entry()``.
    _stash: Mapping[str, object] | None = None

    def close(self) -> None:
        """Close the journal reader."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _prepare(self) -> None:
        if self._reader is None:
            self._open()
        elif self._reader.process() == self._module.INVALIDATE:
            self._check_files()  # files were added or removed: rotation or vacuum

    def _next_entry(self) -> Mapping[str, object] | None:
        if self._stash is not None:
            entry, self._stash = self._stash, None
            return entry
        try:
            got: Mapping[str, object] | None = self._reader.get_next()
        except OSError as exc:
            self.close()
            raise SourceError("read_error", exc.strerror or "journal read failed") from exc
        return got or None

    def _open(self) -> None:
        journal = _journal()
        if journal is None:
            raise SourceError("unsupported", "systemd-python is not installed")
        self._module = journal
        self._check_files()
        try:
            if self._journal_dir:
                reader = journal.Reader(path=self._journal_dir)
            else:
                reader = journal.Reader(flags=journal.SYSTEM)
            reader.fileno()  # sets up inotify, without which rotation goes unnoticed
        except OSError as exc:
            raise SourceError("read_error", exc.strerror or "journal open failed") from exc
        self._reader = reader
        self._seek_start()
        log.info("journal opened unit=%s from=%s", self.unit, self._start_label())

    def _match_unit(self) -> None:
        self._reader.flush_matches()
        self._reader.add_match(_SYSTEMD_UNIT=self.unit)
        self._reader.add_disjunction()
        self._reader.add_match(UNIT=self.unit, _PID="1")  # systemd's own lines (oom-kill)

    def _seek_start(self) -> None:
        r = self._reader
        self._match_unit()
        if self._cursor:
            r.seek_cursor(self._cursor)
            entry = r.get_next()
            if entry and not r.test_cursor(self._cursor):
                self._stash = entry  # the saved entry was vacuumed: resume at the next one
        elif self._since is not None:
            r.seek_realtime(self._since)
        else:
            self._seek_invocation()

    def _seek_invocation(self) -> None:
        """Position before the first entry of the unit's latest invocation (else the tail)."""
        r = self._reader
        r.seek_tail()
        last = r.get_previous()
        # The unit's own lines carry _SYSTEMD_INVOCATION_ID; systemd's lines about it
        # ("Failed with result 'oom-kill'") carry INVOCATION_ID.
        invocation = last and (last.get("_SYSTEMD_INVOCATION_ID") or last.get("INVOCATION_ID"))
        if not invocation:
            return  # nothing logged yet (or no invocation id): follow new entries
        r.flush_matches()
        r.add_match(_SYSTEMD_INVOCATION_ID=str(invocation))
        r.add_disjunction()
        r.add_match(INVOCATION_ID=str(invocation), UNIT=self.unit)
        r.seek_head()
        first = r.get_next()
        self._match_unit()
        if first:
            r.seek_realtime(first["__REALTIME_TIMESTAMP"])

    def _start_label(self) -> str:
        if self._cursor:
            return "cursor"
        return "since" if self._since is not None else "invocation"


class JournalctlLogSource(_JournalFollower):
    """The same as ``JournalLogSource`` through ``journalctl --follow --output=json``.

    For hosts without systemd-python. The child is read without blocking and restarted
    from the saved cursor when it exits.
    """

    def __init__(
        self,
        unit: str,
        *,
        cursor_file: str | None,
        since: float | None,
        journal_dir: str | None = None,
        journalctl: str = "journalctl",
        max_lines: int = LINES_PER_SAMPLE,
    ) -> None:
        super().__init__(
            unit, cursor_file=cursor_file, since=since, journal_dir=journal_dir, max_lines=max_lines
        )
        self._journalctl = journalctl
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._records: deque[dict[str, Any]] = deque()

    def close(self) -> None:
        """Stop the journalctl child and close its pipes."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    def _command(self) -> list[str]:
        cmd = [self._journalctl, "--follow", "--output=json", "--no-pager", "--all"]
        cmd += ["--unit", self.unit]
        if self._journal_dir:
            cmd += ["--directory", self._journal_dir]
        if self._cursor:
            cmd += ["--after-cursor", self._cursor]
        elif self._since is not None:
            cmd += ["--since", f"@{self._since:.6f}", "--lines=all"]
        else:
            cmd += [f"--lines={JOURNALCTL_BACKLOG_LINES}"]
        return cmd

    def _prepare(self) -> None:
        if self._proc is not None:
            return
        self._check_files()
        try:
            proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise SourceError("unsupported", "journalctl cannot be run") from exc
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._proc, self._pending = proc, b""
        self._records.clear()

    def _next_entry(self) -> Mapping[str, object] | None:
        if not self._records:
            self._records.extend(self._read_records())
        return self._records.popleft() if self._records else None

    def _read_records(self) -> list[dict[str, Any]]:
        """The JSON records in what the child wrote since the last call."""
        assert self._proc is not None and self._proc.stdout is not None
        try:
            chunk = self._proc.stdout.read(_CHUNK)
        except BlockingIOError:
            return []
        *lines, self._pending = (self._pending + (chunk or b"")).split(b"\n")
        records = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
        return records

    def _finish(self, *, got_entries: bool) -> None:
        if got_entries or self._proc is None or self._proc.poll() is None:
            return
        assert self._proc.stderr is not None
        stderr = self._proc.stderr.read().decode("utf-8", errors="replace").strip()
        self.close()
        if "permission" in stderr.lower():
            raise SourceError("permission_denied", "journalctl: insufficient permissions")
        if "no journal files" in stderr.lower():
            raise SourceError("missing", "journalctl found no journal files")
        raise SourceError("journalctl_exited", stderr.splitlines()[-1][:200] if stderr else "")


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
    cursor = str(state / f"{target.name}.journal-cursor")
    if _journal() is not None:
        return JournalLogSource(target.unit, cursor_file=cursor, since=None)
    journalctl = shutil.which("journalctl") or "journalctl"
    return JournalctlLogSource(target.unit, cursor_file=cursor, since=None, journalctl=journalctl)
