"""/proc readers of the process source: kept descriptors, their budget, stat and io parsing.

No psutil: each member of a tree costs one read of /proc/PID/stat and one of /proc/PID/io a
tick, through descriptors kept open while the budget allows.
"""

from __future__ import annotations

import enum
import functools
import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import Final

from exporter.base.errors import SourceError

PROC: Final = "/proc"
_CAP_SYS_PTRACE: Final = 19
# Indices into /proc/PID/stat's fields after the command name (proc(5) numbers minus 3).
_STAT_STATE: Final = 0
_STAT_PPID: Final = 1
_STAT_UTIME: Final = 11  # then stime, cutime, cstime
_STAT_START: Final = 19
_STAT_RSS: Final = 21
_STAT_EXIT_SIGNAL: Final = 35
_PROC_READ_BYTES: Final = 4096
_MAX_KEPT_FDS: Final = 16384
#: Left to the rest under a large limit: the web server's 1024 connections, then sockets,
#: pipes, logs and sqlite.
_FDS_FOR_THE_REST: Final = 2048
# hidepid=2/invisible and 4/ptraceable remove other users' /proc/PID entirely (ProtectProc=).
_HIDING_MODES: Final = frozenset({"2", "invisible", "4", "ptraceable"})


class ProcessError(enum.StrEnum):
    """Bounded reasons the process source could not observe (``SourceError.reason``)."""

    PERMISSION_DENIED = "permission_denied"
    NOT_VISIBLE = "not_visible"
    INVALID_FINDER = "invalid_finder"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True)
class Reading:
    """One process's counters in one sample."""

    rss: int
    cpu: float
    read_bytes: int | None
    io_error: ProcessError | None
    zombie: bool
    #: Bytes it had the storage layer write (``write_bytes``): a download lands here.
    write_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class _Stat:
    """The fields of /proc/PID/stat the tree needs."""

    ppid: int
    zombie: bool
    cpu: float
    start: int
    rss: int
    thread: bool


def _parse_stat(raw: bytes) -> _Stat | None:
    """Parse /proc/PID/stat; None when it is not one (empty or cut short)."""
    fields = raw.rpartition(b")")[2].split()
    if len(fields) <= _STAT_EXIT_SIGNAL:
        return None
    # Reaped children's CPU folds into cutime/cstime as their read_bytes fold into the
    # parent's /proc/PID/io, so both tree totals survive a reaped worker.
    ticks = sum(int(f) for f in fields[_STAT_UTIME : _STAT_UTIME + 4])
    return _Stat(
        ppid=int(fields[_STAT_PPID]),
        zombie=fields[_STAT_STATE] == b"Z",
        cpu=ticks / _clock_ticks(),
        start=int(fields[_STAT_START]),
        rss=int(fields[_STAT_RSS]) * _page_size(),
        # A thread id also opens as /proc/TID; its exit_signal is -1, a process's is not.
        thread=fields[_STAT_EXIT_SIGNAL] == b"-1",
    )


def read_once(path: str, size: int = _PROC_READ_BYTES) -> bytes:
    """Up to ``size`` bytes of a /proc file opened and closed for this one read.

    Raises:
        OSError: the file cannot be opened or read (gone, refused).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_all(path: str) -> bytes:
    """A whole /proc file, opened and closed for this read.

    The kernel hands seq_file-backed files (``children``, ``cgroup.procs``) out a page at a
    time: one ``read()`` of a 2,000-process children list returns a fifth of it.

    Raises:
        OSError: the file cannot be opened or read (gone, refused).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def parent_of(pid: int) -> int | None:
    """The parent of process ``pid``; None when it is gone, unreadable or a thread."""
    try:
        stat = _parse_stat(read_once(f"{PROC}/{pid}/stat"))
    except OSError:
        return None
    return None if stat is None or stat.thread else stat.ppid


class _Gone(Exception):
    """The process ended while it was being read."""


class Member:
    """One process of a tree, read from /proc without psutil (one or two reads a tick).

    Its files stay open while the descriptor budget allows: a kept descriptor is bound to
    this very process, so once it is reaped reads fail (ESRCH) even if the pid is reused.
    Without one, the start time read back tells a reused pid apart.
    """

    __slots__ = (
        "_io",
        "_io_error",
        "_io_raw",
        "_raw",
        "_read_bytes",
        "_reading",
        "_stat",
        "_stat_file",
        "_write_bytes",
        "due_at",
        "moved",
        "pid",
        "ppid",
        "start",
    )

    def __init__(self, pid: int, stat_file: _ProcFile, raw: bytes, stat: _Stat) -> None:
        self.pid = pid
        self.ppid = stat.ppid
        self.start = stat.start
        self._stat_file = stat_file
        self._raw = raw
        self._stat = stat
        self._io: _ProcFile | None = None
        self._io_error: ProcessError | None = None
        self._io_raw = b""
        self._read_bytes: int | None = None
        self._write_bytes: int | None = None
        self._reading: Reading | None = None
        #: When a steady tree reads this member next (monotonic); 0 reads it at once.
        self.due_at = 0.0
        #: Whether the last ``read`` found its stat or io changed (an idle one reads the same).
        self.moved = True

    @property
    def last(self) -> Reading | None:
        """What the last ``read`` returned; None before the first."""
        return self._reading

    @classmethod
    def open(cls, pid: int) -> Member | None:
        """The process ``pid``, or None when it is gone (or is a thread, not a process)."""
        try:
            stat_file = _ProcFile.open(f"{PROC}/{pid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            return None
        except PermissionError as exc:
            raise _stat_refused() from exc
        try:
            raw = stat_file.read()
        except OSError:
            raw = b""
        stat = _parse_stat(raw)
        if stat is None or stat.thread:
            stat_file.close()
            return None
        return cls(pid, stat_file, raw, stat)

    def close(self) -> None:
        """Give back the kept descriptors."""
        self._stat_file.close()
        if self._io is not None:
            self._io.close()
            self._io = None

    def still_there(self) -> bool:
        """Whether this very process has not been reaped yet, so its pid is not reused."""
        try:
            raw = self._stat_file.read()
        except OSError:
            return False
        stat = self._stat if raw == self._raw else _parse_stat(raw)
        return stat is not None and stat.start == self.start

    def read(self, *, retry_io: bool) -> Reading | None:
        """The counters now, or None when the process ended or its pid was reused."""
        try:
            raw = self._stat_file.read()
        except (FileNotFoundError, ProcessLookupError):
            return None
        except PermissionError as exc:
            raise _stat_refused() from exc
        self.moved = raw != self._raw
        if self.moved:  # an idle process reads back byte for byte: nothing to parse
            stat = _parse_stat(raw)
            if stat is None or stat.start != self.start:
                return None
            self._raw, self._stat, self._reading = raw, stat, None
        stat = self._stat
        try:
            # A zombie's bytes are about to fold into its parent: counting both would jump.
            io_error = None if stat.zombie else self._read_io(retry_io)
        except _Gone:
            return None
        read_bytes, write_bytes = (0, 0) if stat.zombie else (self._read_bytes, self._write_bytes)
        if io_error is not None:
            read_bytes = write_bytes = None
        last = self._reading
        if (
            last is None
            or (last.read_bytes, last.write_bytes) != (read_bytes, write_bytes)
            or last.io_error != io_error
        ):
            rss = 0 if stat.zombie else stat.rss
            last = self._reading = Reading(
                rss, stat.cpu, read_bytes, io_error, stat.zombie, write_bytes
            )
        return last

    def _read_io(self, retry: bool) -> ProcessError | None:
        """Read ``read_bytes`` and ``write_bytes`` of /proc/PID/io; the error when refused.

        The file is mode 0400 (needs CAP_SYS_PTRACE for others' processes).
        """
        if not _io_accounting_supported():
            return ProcessError.UNSUPPORTED  # kernel without task I/O accounting
        io = self._io if self._io is not None else self._open_io(retry)
        if io is None:
            return self._io_error
        try:
            raw = io.read()
        except PermissionError:  # checked again on each read: the process changed credentials
            io.close()
            self._io, self._io_error = None, ProcessError.PERMISSION_DENIED
            return self._io_error
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise _Gone from exc
        self._io_error = None
        if raw != self._io_raw:
            self.moved = True
            self._io_raw = raw
            self._read_bytes = _io_field(raw, b"\nread_bytes: ")
            self._write_bytes = _io_field(raw, b"\nwrite_bytes: ")
        return None

    def _open_io(self, retry: bool) -> _ProcFile | None:
        """/proc/PID/io opened now, or None when refused (the reason left in ``_io_error``)."""
        if self._io_error is not None and not retry:
            return None  # refused before: retried on full ticks only
        try:
            self._io = _ProcFile.open(f"{PROC}/{self.pid}/io")
        except PermissionError:
            self._io_error = ProcessError.PERMISSION_DENIED
            return None
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise _Gone from exc
        return self._io


def _stat_refused() -> SourceError:
    return SourceError(ProcessError.PERMISSION_DENIED, "/proc/PID/stat refused")


class _ProcFile:
    """A /proc file read again every tick, through a kept descriptor while the budget allows."""

    __slots__ = ("_budget", "_close", "_fd", "path")

    def __init__(self, path: str, fd: int | None, budget: _FdBudget) -> None:
        self.path = path
        self._fd = fd
        # Held here, not looked up at close: __del__ may run while the interpreter exits.
        self._budget = budget
        self._close = os.close

    @classmethod
    def open(cls, path: str) -> _ProcFile:
        """Open ``path`` (kept open if the budget allows). Raises OSError when it cannot."""
        budget = fd_budget()
        if not budget.take():
            os.close(os.open(path, os.O_RDONLY))  # checks it exists and may be opened
            return cls(path, None, budget)
        try:
            return cls(path, os.open(path, os.O_RDONLY), budget)
        except OSError:
            budget.give()
            raise

    def read(self) -> bytes:
        """The file's content now (regenerated by the kernel on every read)."""
        if self._fd is not None:
            return os.pread(self._fd, _PROC_READ_BYTES, 0)
        return read_once(self.path)

    def close(self) -> None:
        """Close the kept descriptor, if any, and give it back to the budget."""
        if self._fd is not None:
            self._close(self._fd)
            self._fd = None
            self._budget.give()

    def __del__(self) -> None:
        # A tree dropped without close() (a target removed by a config reload) still gives
        # its descriptors back.
        self.close()


class _FdBudget:
    """How many /proc descriptors the process sources of this process may keep open.

    All of the soft RLIMIT_NOFILE but 2048 (at least a quarter of it), at most 16384 (64
    targets of 64 workers, two files and a pidfd each): the web server's connections,
    sockets, pipes and sqlite keep the rest. Members beyond the budget open and close their
    files on every read instead (a third more CPU a read), and a quiet one without a pidfd is
    read every tick.
    """

    def __init__(self, total: int) -> None:
        self._left = total
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Reserve one descriptor; False when none is left."""
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def give(self) -> None:
        """Return one descriptor."""
        with self._lock:
            self._left += 1


@functools.cache
def fd_budget() -> _FdBudget:
    """The one budget of kept descriptors shared by every tree of this process."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _FdBudget(_MAX_KEPT_FDS)
    total = min(max(soft // 4, soft - _FDS_FOR_THE_REST), _MAX_KEPT_FDS)
    return _FdBudget(total)


@functools.cache
def pids_are_ours() -> bool:
    """Whether /proc numbers pids as this process's namespace does.

    /proc mounted from another pid namespace (a container seeing the host's) numbers them
    differently from the kernel calls made here (``/proc/loadavg``'s cursor, ``pidfd_open``).
    """
    try:
        return os.readlink(f"{PROC}/self") == str(os.getpid())
    except OSError:
        return False


@functools.cache
def _io_accounting_supported() -> bool:
    return os.path.exists(f"{PROC}/self/io")


@functools.cache
def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _io_field(raw: bytes, name: bytes) -> int | None:
    """One counter of /proc/PID/io (``name`` with its leading newline); None when absent."""
    at = raw.find(name)
    if at < 0:
        return None
    at += len(name)
    end = raw.find(b"\n", at)
    return int(raw[at : end if end >= 0 else len(raw)])


def start_epoch(start_ticks: int) -> float:
    """A process's start (``/proc/PID/stat`` field 22) as Unix epoch seconds.

    Counted from the boot time as read once, when the exporter started: the kernel's boot
    time moves when the wall clock is stepped, and a start time that moved with it would
    look like a restarted engine. The daemon moves these by the steps its clock saw.
    """
    return boot_epoch() + start_ticks / _clock_ticks()


@functools.cache
def boot_epoch() -> float:
    """When the machine booted, as Unix epoch seconds, read once.

    From the clocks, not /proc/stat's ``btime``: that is whole seconds, and a start counted
    from it reads up to a second early (before a ``wait --started-after`` mark taken just
    ahead of the start). /proc's start times count ticks of CLOCK_BOOTTIME.
    """
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


@functools.cache
def _page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


@functools.cache
def proc_hides_pids() -> bool:
    """True when /proc is mounted with hidepid and this process is not exempt from it."""
    options = _proc_mount_options()
    if options.get("hidepid") not in _HIDING_MODES:
        return False
    gid = options.get("gid")
    if gid is not None and gid.isdigit() and int(gid) in {os.getegid(), *os.getgroups()}:
        return False
    return not _has_capability(_CAP_SYS_PTRACE)


def _proc_mount_options() -> dict[str, str]:
    """Super options of the topmost proc mount on /proc, e.g. {"hidepid": "invisible"}."""
    options: dict[str, str] = {}
    try:
        with open(f"{PROC}/self/mountinfo", encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return options
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) > 4 and fields[4] == PROC and len(rest) > 2 and rest[0] == "proc":
            pairs = (opt.partition("=") for opt in rest[2].split(","))
            options = {key: value for key, _, value in pairs}
    return options


def _has_capability(bit: int) -> bool:
    try:
        with open(f"{PROC}/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return False
