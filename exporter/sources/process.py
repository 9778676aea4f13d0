"""Process-tree source: finds a target's main process and sums RSS, CPU and read bytes of its tree.

I/O only. No full host scan while the main process is known, and never a command line in a
log line, an error or a sample.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import re
import resource
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import psutil

from exporter.config import Target
from exporter.core.model import ProcessSample
from exporter.errors import SourceError

log = logging.getLogger(__name__)

DEFAULT_CGROUP_ROOT: Final = "/sys/fs/cgroup"
DEFAULT_RESCAN_EVERY: Final = 10
_PROC: Final = "/proc"
# Unified v2 at the root, v2 beside v1 in the hybrid layout, then the v1 named hierarchy.
_CGROUP_HIERARCHIES: Final = ("", "unified", "systemd")
_SLICE_DEPTH: Final = 4
_TCP_TABLES: Final = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN: Final = "0A"
_CAP_SYS_PTRACE: Final = 19
# Indices into /proc/PID/stat's fields after the command name (proc(5) numbers minus 3).
_STAT_STATE: Final = 0
_STAT_PPID: Final = 1
_STAT_UTIME: Final = 11  # then stime, cutime, cstime
_STAT_START: Final = 19
_STAT_RSS: Final = 21
_STAT_EXIT_SIGNAL: Final = 35
_PROC_READ_BYTES: Final = 4096
_MAX_KEPT_FDS: Final = 2048
# New pids checked one by one up to this many (or the tree's size); past it, children files.
_MIN_PID_RANGE: Final = 256
_PID_RECHECK: Final = 8
# hidepid=2/invisible and 4/ptraceable remove other users' /proc/PID entirely (ProtectProc=).
_HIDING_MODES: Final = frozenset({"2", "invisible", "4", "ptraceable"})


class ProcessError(enum.StrEnum):
    """Bounded reasons the process source could not observe (``SourceError.reason``)."""

    PERMISSION_DENIED = "permission_denied"
    NOT_VISIBLE = "not_visible"
    INVALID_FINDER = "invalid_finder"
    UNSUPPORTED = "unsupported"


class _Finder(Protocol):
    """Finds a target's main process; one implementation per target key."""

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The main process now, or None when there is none (absent, not an error)."""
        ...

    def members(self) -> list[int] | None:
        """Every pid of the target when the finder knows them (a cgroup), else None."""
        ...


@dataclass(frozen=True, slots=True)
class _Reading:
    """One process's counters in one sample."""

    rss: int
    cpu: float
    read_bytes: int | None
    io_error: ProcessError | None
    zombie: bool


class ProcessSource:
    """Samples one target's process tree; constructed once per target, called once per tick.

    The main process is found by the target's ``unit`` (its cgroup), ``pidfile`` or ``cmdline``
    regex, or else as the listener of ``base_url``'s port. The tree is the main process and
    every descendant seen since it started (a reparented worker stays in it while it lives),
    or every member of the unit's cgroup. Each member costs one read of /proc/PID/stat and
    one of /proc/PID/io a tick, through descriptors kept open (a reused pid is a new process);
    new children are looked for only among the pids allocated since the last tick, or, when
    there are too many, in ``/proc/PID/task/TID/children``: the main thread every tick, all
    threads every ``rescan_every`` ticks.
    """

    def __init__(
        self,
        target: Target,
        *,
        cgroup_root: str = DEFAULT_CGROUP_ROOT,
        rescan_every: int = DEFAULT_RESCAN_EVERY,
    ) -> None:
        self.target = target
        self._finder = _make_finder(target, cgroup_root)
        self._rescan_every = max(1, rescan_every)
        self._ticks = 0
        self._tree: _Tree | None = None
        self._io_error: str | None = None

    def sample(self) -> ProcessSample | None:
        """The tree now, or None when no process is found (a valid observation).

        Raises:
            SourceError: the source cannot observe at all ("permission_denied" when /proc
                refuses, "not_visible" when /proc hides the target, "invalid_finder").
        """
        self._ticks += 1
        full = self._ticks % self._rescan_every == 0
        main = self._finder.find(self._tree.main if self._tree else None, full)
        if main is None:
            self._forget()
            return None
        if self._tree is None or self._tree.main != main:
            self._forget()
            self._tree = _Tree.adopt(main)
            if self._tree is None:
                return None
            full = True
            log.info("process found target=%s pid=%d", self.target.name, main.pid)
        self._tree.refresh(self._finder.members(), full=full)
        readings = self._tree.read(full=full)
        if main.pid not in readings:
            self._forget()  # the main process ended while being read
            return None
        sample = _summarise(self._tree, readings)
        self._note_io(sample.read_bytes_error)
        return sample

    def _forget(self) -> None:
        if self._tree is not None:
            log.info("process gone target=%s pid=%d", self.target.name, self._tree.main.pid)
            self._tree.close()
        self._tree = None

    def _note_io(self, error: str | None) -> None:
        if error != self._io_error and error is not None:
            log.warning("read bytes unavailable target=%s reason=%s", self.target.name, error)
        elif error != self._io_error:
            log.info("read bytes available target=%s", self.target.name)
        self._io_error = error


class _Tree:
    """The processes of one main-process instance, keyed by pid.

    New members are found through the kernel's pid allocation cursor (the last pid in
    ``/proc/loadavg``): only pids allocated since the last tick can be new children, whichever
    thread forked them, so a tree on a quiet host costs no children reads at all. When that
    range is too wide to check (a burst of new threads) or the cursor is unusable, the
    children files are read instead: the main threads' every tick, all threads' on full ticks.
    """

    def __init__(self, main: psutil.Process, create_time: float) -> None:
        self.main = main
        self.create_time = create_time
        self.members: dict[int, _Member] = {}
        self._last_pid: int | None = None
        self._recheck: list[int] = []

    @classmethod
    def adopt(cls, main: psutil.Process) -> _Tree | None:
        """A new tree rooted at ``main``, or None when it ended before it could be read."""
        try:
            tree = cls(main, main.create_time())
        except psutil.NoSuchProcess:
            return None
        member = _Member.open(main.pid)
        if member is None:
            return None
        tree.members[main.pid] = member
        return tree

    def close(self) -> None:
        """Give back every kept descriptor."""
        for member in self.members.values():
            member.close()
        self.members.clear()

    def refresh(self, known: list[int] | None, *, full: bool) -> None:
        """Add the cgroup's members, or the processes forked since the last tick."""
        if known is not None:
            self._replace(known)
        elif not _children_files_supported():
            if full:
                self._descend_by_scan()
        elif not self._discover_new_pids():
            self._descend(all_threads=full)

    def read(self, *, full: bool) -> dict[int, _Reading]:
        """Read every member; a process that ended (or whose pid was reused) is dropped."""
        readings: dict[int, _Reading] = {}
        for pid, member in list(self.members.items()):
            reading = member.read(retry_io=full)
            if reading is None:
                self._drop(pid)
            else:
                readings[pid] = reading
        return readings

    def _add(self, pid: int, *, child: bool = True) -> bool:
        member = _Member.open(pid)
        if member is None:
            return False
        if child and member.ppid not in self.members:
            member.close()  # ended and its pid reused between the listing and the open
            return False
        self.members[pid] = member
        return True

    def _drop(self, pid: int) -> None:
        member = self.members.pop(pid, None)
        if member is not None:
            member.close()

    def _replace(self, pids: list[int]) -> None:
        wanted = set(pids) | {self.main.pid}
        for pid in set(self.members) - wanted:
            self._drop(pid)
        for pid in wanted - set(self.members):
            self._add(pid, child=False)

    def _discover_new_pids(self) -> bool:
        """Adopt children among the pids allocated since the last tick; False if it cannot."""
        last = _last_pid()
        previous, self._last_pid = self._last_pid, last
        if last is None or previous is None:
            return False
        if last == previous:
            return True
        new = _new_pids(previous, last, max(_MIN_PID_RANGE, len(self.members)))
        if new is None:
            return False
        # A pid is allocated a moment before its process shows in /proc: the last few pids
        # that were not there yet are looked at once more next tick.
        candidates, self._recheck = [*self._recheck, *new], []
        parents = {}
        for pid in candidates:
            if pid in self.members:
                continue
            parent = _parent_of(pid)
            if parent is not None:
                parents[pid] = parent
            elif pid in new[-_PID_RECHECK:]:
                self._recheck.append(pid)
        self._adopt_descendants(parents)
        return True

    def _adopt_descendants(self, parents: dict[int, int]) -> None:
        # After a pid wrap a grandchild may come before its parent: loop until nothing moves.
        added = True
        while added:
            added = False
            for pid, parent in list(parents.items()):
                if parent in self.members:
                    del parents[pid]
                    added = self._add(pid) or added

    def _descend(self, *, all_threads: bool) -> None:
        queue = list(self.members)
        while queue:
            pid = queue.pop()
            for child in _children(pid, all_threads=all_threads):
                if child not in self.members and self._add(child):
                    queue.append(child)

    def _descend_by_scan(self) -> None:
        # Kernels without CONFIG_PROC_CHILDREN: psutil reads every /proc/PID/stat instead.
        try:
            found = self.main.children(recursive=True)
        except psutil.Error:
            return
        for proc in found:
            if proc.pid not in self.members:
                self._add(proc.pid, child=False)


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


class _Gone(Exception):
    """The process ended while it was being read."""


class _Member:
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
        self._reading: _Reading | None = None

    @classmethod
    def open(cls, pid: int) -> _Member | None:
        """The process ``pid``, or None when it is gone (or is a thread, not a process)."""
        try:
            stat_file = _ProcFile.open(f"{_PROC}/{pid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            return None
        except PermissionError as exc:
            raise SourceError(ProcessError.PERMISSION_DENIED, "/proc/PID/stat refused") from exc
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

    def read(self, *, retry_io: bool) -> _Reading | None:
        """The counters now, or None when the process ended or its pid was reused."""
        try:
            raw = self._stat_file.read()
        except (FileNotFoundError, ProcessLookupError):
            return None
        except PermissionError as exc:
            raise SourceError(ProcessError.PERMISSION_DENIED, "/proc/PID/stat refused") from exc
        if raw != self._raw:  # an idle process reads back byte for byte: nothing to parse
            stat = _parse_stat(raw)
            if stat is None or stat.start != self.start:
                return None
            self._raw, self._stat, self._reading = raw, stat, None
        stat = self._stat
        try:
            # A zombie's bytes are about to fold into its parent: counting both would jump.
            read_bytes, io_error = (0, None) if stat.zombie else self._read_io(retry_io)
        except _Gone:
            return None
        last = self._reading
        if last is None or last.read_bytes != read_bytes or last.io_error != io_error:
            rss = 0 if stat.zombie else stat.rss
            last = self._reading = _Reading(rss, stat.cpu, read_bytes, io_error, stat.zombie)
        return last

    def _read_io(self, retry: bool) -> tuple[int | None, ProcessError | None]:
        """``read_bytes`` of /proc/PID/io; it is mode 0400 (needs CAP_SYS_PTRACE for others)."""
        if not _io_accounting_supported():
            return None, ProcessError.UNSUPPORTED  # kernel without task I/O accounting
        if self._io is None:
            if self._io_error is not None and not retry:
                return None, self._io_error  # refused before: retried on full ticks only
            try:
                self._io = _ProcFile.open(f"{_PROC}/{self.pid}/io")
            except PermissionError:
                self._io_error = ProcessError.PERMISSION_DENIED
                return None, self._io_error
            except (FileNotFoundError, ProcessLookupError) as exc:
                raise _Gone from exc
        try:
            raw = self._io.read()
        except PermissionError:  # checked again on each read: the process changed credentials
            self._io.close()
            self._io, self._io_error = None, ProcessError.PERMISSION_DENIED
            return None, self._io_error
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise _Gone from exc
        self._io_error = None
        if raw != self._io_raw:
            at = raw.find(b"read_bytes: ")
            self._io_raw = raw
            self._read_bytes = int(raw[at + 12 : raw.index(b"\n", at)]) if at >= 0 else None
        return self._read_bytes, None


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
        budget = _fd_budget()
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
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.read(fd, _PROC_READ_BYTES)
        finally:
            os.close(fd)

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

    A quarter of the soft RLIMIT_NOFILE, at most 2048: sockets, pipes and sqlite keep the
    rest. Members beyond the budget open and close their files on every read instead.
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
def _fd_budget() -> _FdBudget:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    total = _MAX_KEPT_FDS if soft == resource.RLIM_INFINITY else min(soft // 4, _MAX_KEPT_FDS)
    return _FdBudget(total)


def _make_finder(target: Target, cgroup_root: str) -> _Finder:
    if target.unit:
        return _UnitFinder(target.unit, cgroup_root)
    if target.pidfile:
        return _PidfileFinder(target.pidfile, target.name)
    if target.cmdline:
        return _CmdlineFinder(target.cmdline)
    words = target.profile.process_words
    if not words:
        return _PortFinder(target.port)
    # Before the engine listens, its command line names it and its port.
    pattern = rf"(?:{words}).*--port[= ]{target.port}(?!\d)"
    return _PortThenCmdlineFinder(_PortFinder(target.port), _CmdlineFinder(pattern))


class _PortThenCmdlineFinder:
    """The port's listener; until the engine listens, its command line with that port."""

    def __init__(self, port: _PortFinder, cmdline: _CmdlineFinder) -> None:
        self._port, self._cmdline = port, cmdline

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The listener if there is one, else the matching command line."""
        found = self._port.find(tracked, full)
        if found is not None:
            return found
        try:
            return self._cmdline.find(None, full)
        except SourceError:
            return None  # hidden processes: the port finder already reported what it could

    def members(self) -> list[int] | None:
        """Unknown: the tree is walked from the main process."""
        return None


class _UnitFinder:
    """A systemd unit: the oldest process of its cgroup whose parent is outside it."""

    def __init__(self, unit: str, cgroup_root: str) -> None:
        self._name = unit if "." in unit else f"{unit}.service"
        self._root = cgroup_root
        self._dir: str | None = None
        self._pids: list[int] = []

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """Read the cgroup's processes; keep the tracked main process while it lives in it."""
        if "/" in self._name or self._name.startswith(".."):
            raise SourceError(ProcessError.INVALID_FINDER, "unit name must not contain '/'")
        self._pids = self._read_procs(full)
        if not self._pids:
            return None
        if tracked is not None and tracked.pid in self._pids and _alive(tracked):
            return tracked
        procs = [p for pid in self._pids if (p := _process(pid)) is not None]
        if not procs:
            for pid in self._pids:
                _raise_if_hidden(pid)
            return None
        return _oldest_root(procs)

    def members(self) -> list[int] | None:
        """Every process of the unit's cgroup, read by the last ``find``."""
        return self._pids

    def _read_procs(self, full: bool) -> list[int]:
        if self._dir is None or not os.path.isdir(self._dir):
            self._dir = self._locate(walk=full or self._dir is None)
        if self._dir is None:
            return []
        pids: dict[int, None] = {}
        for top, _dirs, _files in os.walk(self._dir):
            pids.update(dict.fromkeys(_read_pids(os.path.join(top, "cgroup.procs"))))
        return list(pids)

    def _locate(self, *, walk: bool) -> str | None:
        for hierarchy in _CGROUP_HIERARCHIES:
            path = os.path.join(self._root, hierarchy, "system.slice", self._name)
            if os.path.isdir(path):
                return path
        if not walk:
            return None
        for hierarchy in _CGROUP_HIERARCHIES:
            if found := _find_in_slices(os.path.join(self._root, hierarchy), self._name):
                return found
        return None


def _find_in_slices(base: str, name: str, depth: int = _SLICE_DEPTH) -> str | None:
    """Search ``name`` in ``base`` and, ``depth`` levels down, in slices and user managers."""
    if os.path.isdir(candidate := os.path.join(base, name)):
        return candidate
    if depth == 0:
        return None
    try:
        entries = list(os.scandir(base))
    except OSError:
        return None
    for entry in entries:
        nests = entry.name.endswith(".slice") or entry.name.startswith("user@")
        if nests and entry.is_dir() and (found := _find_in_slices(entry.path, name, depth - 1)):
            return found
    return None


class _PidfileFinder:
    """A pidfile written by the server or its supervisor."""

    def __init__(self, path: str, target: str) -> None:
        self._path = path
        self._target = target
        self._warned = False

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The process the pidfile names; a missing file or dead pid is absence."""
        try:
            with open(self._path, encoding="ascii", errors="replace") as f:
                text = f.read(64)
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise SourceError(ProcessError.PERMISSION_DENIED, "pidfile unreadable") from exc
        pid = _parse_pid(text)
        if pid is None:
            self._warn_once()
            # A pidfile being rewritten reads empty for an instant; keep the known process.
            return tracked if tracked is not None and _alive(tracked) else None
        if tracked is not None and tracked.pid == pid and _alive(tracked):
            return tracked
        proc = _process(pid)
        if proc is None:
            _raise_if_hidden(pid)
        return proc

    def members(self) -> list[int] | None:
        """Unknown: the tree is walked from the main process."""
        return None

    def _warn_once(self) -> None:
        if not self._warned:
            log.warning("pidfile holds no pid target=%s path=%s", self._target, self._path)
            self._warned = True


def _parse_pid(text: str) -> int | None:
    """The pid on a pidfile's first line, or None when it holds none."""
    words = text.split(maxsplit=1)
    if not words or not words[0].isdigit():
        return None
    pid = int(words[0])
    return pid if pid > 0 else None


class _CmdlineFinder:
    """A regex over the joined command line; scans /proc only while nothing is tracked.

    Pids whose command line did not match are not read again until a full tick, so an idle
    host costs one ``listdir(/proc)`` a tick; a process that ``exec``s into a matching
    command line is found within ``rescan_every`` ticks.
    """

    def __init__(self, pattern: str) -> None:
        self._source = pattern
        self._pattern: re.Pattern[str] | None = None
        self._unmatched: set[int] = set()

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The oldest matching process whose parent does not match."""
        if tracked is not None and _alive(tracked):
            return tracked
        pattern = self._compiled()
        pids = set(_all_pids())
        self._unmatched = set() if full else self._unmatched & pids
        matches = []
        for pid in pids - self._unmatched - {os.getpid()}:
            proc = _process(pid)
            if proc is not None and _cmdline_matches(proc, pattern):
                matches.append(proc)
            else:
                self._unmatched.add(pid)
        if not matches and _proc_hides_pids():
            raise SourceError(ProcessError.NOT_VISIBLE, "/proc hides other users' processes")
        return _oldest_root(matches)

    def members(self) -> list[int] | None:
        """Unknown: the tree is walked from the main process."""
        return None

    def _compiled(self) -> re.Pattern[str]:
        if self._pattern is None:
            try:
                self._pattern = re.compile(self._source)
            except re.error as exc:
                raise SourceError(ProcessError.INVALID_FINDER, "cmdline regex invalid") from exc
        return self._pattern


def _cmdline_matches(proc: psutil.Process, pattern: re.Pattern[str]) -> bool:
    try:
        words = proc.cmdline()
    except psutil.Error:
        return False  # ended, a zombie, or refused
    return bool(words) and pattern.search(" ".join(words)) is not None


class _PortFinder:
    """The process holding the listening socket of base_url's port.

    vLLM and SGLang refuse connections while they load, so a main process found once is kept
    while it lives (same pid and start time) even when its port is not listening.
    """

    def __init__(self, port: int) -> None:
        self._port = port
        self._unresolved: frozenset[int] = frozenset()
        self._unresolved_error: SourceError | None = None

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The listener's main process, or the tracked one while it lives."""
        if tracked is not None and _alive(tracked):
            return tracked
        inodes = _listening_inodes(self._port)
        if not inodes:
            return None
        if inodes == self._unresolved and self._unresolved_error is not None and not full:
            raise self._unresolved_error  # a full /proc/*/fd scan costs; retry on full ticks
        owners, denied = _socket_owners(inodes)
        if owners:
            self._unresolved_error = None
            return _oldest_root(owners)
        if not _listening_inodes(self._port):
            return None  # the listener closed while we looked
        reason = ProcessError.PERMISSION_DENIED if denied else ProcessError.NOT_VISIBLE
        self._unresolved = inodes
        self._unresolved_error = SourceError(reason, "cannot see who listens on the port")
        raise self._unresolved_error

    def members(self) -> list[int] | None:
        """Unknown: the tree is walked from the main process."""
        return None


def _listening_inodes(port: int) -> frozenset[int]:
    """Socket inodes listening on ``port`` (any address, IPv4 or IPv6)."""
    inodes: set[int] = set()
    for table in _TCP_TABLES:
        try:
            with open(table, encoding="ascii") as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue  # no IPv6
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _TCP_LISTEN:
                local_port = int(fields[1].rpartition(":")[2], 16)
                if local_port == port:
                    inodes.add(int(fields[9]))
    return frozenset(inodes)


def _socket_owners(inodes: frozenset[int]) -> tuple[list[psutil.Process], bool]:
    """Processes holding any of the socket ``inodes``, and whether some fd table was refused."""
    links = {f"socket:[{inode}]" for inode in inodes}
    owners: list[psutil.Process] = []
    denied = False
    for pid in _all_pids():
        try:
            holds = _holds_socket(pid, links)
        except PermissionError:
            denied = True  # another user's fds, or a target holding more capabilities
            continue
        if holds and (proc := _process(pid)) is not None:
            owners.append(proc)
    return owners, denied


def _all_pids() -> Iterator[int]:
    return (int(name) for name in os.listdir(_PROC) if name.isdigit())


def _holds_socket(pid: int, links: set[str]) -> bool:
    fd_dir = f"{_PROC}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return False
    for fd in fds:
        try:
            if os.readlink(f"{fd_dir}/{fd}") in links:
                return True
        except (FileNotFoundError, ProcessLookupError):
            continue  # fd closed meanwhile
    return False


def _process(pid: int) -> psutil.Process | None:
    """A new psutil handle for ``pid``, or None when it does not exist (or is hidden)."""
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _alive(proc: psutil.Process) -> bool:
    """True while this very process runs (psutil compares pid and start time: no reuse)."""
    try:
        return proc.is_running()
    except psutil.Error:
        return False


def _oldest_root(procs: Iterable[psutil.Process]) -> psutil.Process | None:
    """The oldest process whose parent is not in ``procs`` (the top of their tree)."""
    by_pid = {p.pid: p for p in procs}
    roots: list[tuple[float, psutil.Process]] = []
    for proc in by_pid.values():
        try:
            if proc.ppid() not in by_pid:
                roots.append((proc.create_time(), proc))
        except psutil.Error:
            continue  # ended meanwhile
    return min(roots, key=lambda r: (r[0], r[1].pid))[1] if roots else None


def _raise_if_hidden(pid: int) -> None:
    """Raise not_visible when ``pid`` exists but /proc shows nothing of it (hidepid)."""
    try:
        os.kill(pid, 0)
    except PermissionError as exc:
        raise SourceError(ProcessError.NOT_VISIBLE, "/proc hides the target process") from exc
    except (ProcessLookupError, OverflowError):
        return


def _children(pid: int, *, all_threads: bool) -> list[int]:
    """Direct children of ``pid``: forked by its main thread, or by any of its threads."""
    try:
        tids = os.listdir(f"{_PROC}/{pid}/task") if all_threads else [str(pid)]
    except OSError:
        return []
    children: list[int] = []
    for tid in tids:
        try:
            fd = os.open(f"{_PROC}/{pid}/task/{tid}/children", os.O_RDONLY)
        except OSError:
            continue  # thread or process ended
        try:
            children.extend(int(word) for word in os.read(fd, 1 << 16).split())
        except OSError:
            continue
        finally:
            os.close(fd)
    return children


def _parent_of(pid: int) -> int | None:
    """The parent of process ``pid``; None when it is gone, unreadable or a thread."""
    try:
        fd = os.open(f"{_PROC}/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = _parse_stat(os.read(fd, _PROC_READ_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if stat is None or stat.thread else stat.ppid


def _last_pid() -> int | None:
    """The pid the kernel allocated last in our namespace; None when /proc is another's."""
    if not _pid_cursor_usable():
        return None
    try:
        with open(f"{_PROC}/loadavg", "rb") as f:
            return int(f.read().split()[4])
    except (OSError, IndexError, ValueError):
        return None


def _new_pids(previous: int, last: int, limit: int) -> Sequence[int] | None:
    """Pids allocated after ``previous`` up to ``last`` (through a wrap at pid_max).

    None when there are more than ``limit``: reading the children files is cheaper then.
    """
    if last > previous:
        return range(previous + 1, last + 1) if last - previous <= limit else None
    pid_max = _pid_max()
    if pid_max - previous - 1 + last > limit:
        return None
    return [*range(previous + 1, pid_max), *range(1, last + 1)]


@functools.cache
def _pid_cursor_usable() -> bool:
    # /proc mounted from another pid namespace (a container seeing the host's) numbers pids
    # differently from the cursor in /proc/loadavg, which is always our namespace's.
    try:
        return os.readlink(f"{_PROC}/self") == str(os.getpid())
    except OSError:
        return False


@functools.cache
def _pid_max() -> int:
    try:
        with open(f"{_PROC}/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4_194_304  # the kernel's ceiling


@functools.cache
def _io_accounting_supported() -> bool:
    return os.path.exists(f"{_PROC}/self/io")


@functools.cache
def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


@functools.cache
def _page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


@functools.cache
def _children_files_supported() -> bool:
    return os.path.exists(f"{_PROC}/self/task/{os.getpid()}/children")


def _read_pids(path: str) -> list[int]:
    try:
        with open(path, encoding="ascii") as f:
            return [int(word) for word in f.read().split()]
    except FileNotFoundError:
        return []  # the cgroup went away with the unit
    except PermissionError as exc:
        raise SourceError(ProcessError.PERMISSION_DENIED, "cgroup.procs unreadable") from exc


def _summarise(tree: _Tree, readings: dict[int, _Reading]) -> ProcessSample:
    """Sum the readings into one sample; one refused read_bytes makes the sum unknown."""
    main = tree.main
    io_errors = sorted({r.io_error for r in readings.values() if r.io_error})
    read_bytes = None if io_errors else sum(r.read_bytes or 0 for r in readings.values())
    others = sorted(pid for pid in readings if pid != main.pid)
    return ProcessSample(
        pid=main.pid,
        create_time=tree.create_time,
        pids=(main.pid, *others),
        rss_bytes=sum(r.rss for r in readings.values()),
        cpu_seconds=sum(r.cpu for r in readings.values()),
        read_bytes=read_bytes,
        read_bytes_error=str(io_errors[0]) if io_errors else None,
        zombie=readings[main.pid].zombie,
    )


@functools.cache
def _proc_hides_pids() -> bool:
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
        with open(f"{_PROC}/self/mountinfo", encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return options
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) > 4 and fields[4] == _PROC and len(rest) > 2 and rest[0] == "proc":
            pairs = (opt.partition("=") for opt in rest[2].split(","))
            options = {key: value for key, _, value in pairs}
    return options


def _has_capability(bit: int) -> bool:
    try:
        with open(f"{_PROC}/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return False
