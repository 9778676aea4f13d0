"""Finding a target's main process: by systemd unit, container, pidfile, command line or port.

Each finder costs no full host scan while the main process it found lives, and never puts a
command line in a log line or an error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Final, NamedTuple, Protocol

import psutil

from exporter.base.errors import SourceError
from exporter.base.files import FileIdentity, file_identity
from exporter.base.model import SAME_START_SECONDS
from exporter.config import Target, UserRegex
from exporter.sources.process.cgroups import container_id_of, pod_uid_of
from exporter.sources.process.procfs import PROC, ProcessError, boot_epoch, proc_hides_pids

log = logging.getLogger(__name__)

# Unified v2 at the root, v2 beside v1 in the hybrid layout, then the v1 named hierarchy.
_CGROUP_HIERARCHIES: Final = ("", "unified", "systemd")
_SLICE_DEPTH: Final = 4
# Containers also live in the v1 controllers only (kubelet's cgroupfs driver without the
# name=systemd hierarchy): pids and memory are mounted wherever containers run.
_CONTAINER_HIERARCHIES: Final = (*_CGROUP_HIERARCHIES, "pids", "memory")
# Rootless Podman is deepest: user.slice/user-1000.slice/user@1000.service/user.slice/libpod-ID.
_CONTAINER_DEPTH: Final = 5
_CONTAINER_PARENTS: Final = frozenset(
    {"kubepods", "burstable", "besteffort", "docker", "libpod_parent"}
)
_TCP_TABLES: Final = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN: Final = "0A"


class Gone(NamedTuple):
    """A process named as the target's that had ended when it was looked for."""

    pid: int
    #: When it started, at the latest (epoch seconds): the pidfile's write time, or /proc's.
    started_by: float
    #: How early ``started_by`` may read (/proc's start times, ``SAME_START_SECONDS``).
    slack_seconds: float = 0.0


class Finder(Protocol):
    """Finds a target's main process; one implementation per target key."""

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The main process now, or None when there is none (absent, not an error)."""
        ...

    def members(self) -> list[int] | None:
        """Every pid of the target when the finder knows them (a cgroup), else None."""
        ...

    def gone(self) -> Gone | None:
        """The process the last ``find`` was told of but found ended (a pidfile's), if any."""
        ...


class _Walked:
    """A finder that knows the main process only: its tree is walked from it."""

    def members(self) -> list[int] | None:
        """Unknown: the tree is walked from the main process."""
        return None

    def gone(self) -> Gone | None:
        """None: only a pidfile names a process that may be gone already."""
        return None


def finder_inputs(target: Target) -> tuple[object, ...]:
    """Every field of ``target`` that ``make_finder`` reads: equal inputs, the same process."""
    words = target.profile.process_words
    return (target.unit, target.container_id, target.pidfile, target.cmdline, target.port, words)


def make_finder(target: Target, cgroup_root: str) -> Finder:
    """The finder for ``target``'s key: unit, container, pidfile, cmdline, else the port."""
    if target.unit:
        return _UnitFinder(target.unit, cgroup_root)
    if target.container_id is not None:
        return _ContainerFinder(target.container_id, cgroup_root)
    if target.pidfile:
        return _PidfileFinder(target.pidfile, target.name)
    if target.cmdline:
        return _CmdlineFinder(target.cmdline)
    words = target.profile.process_words
    if not words:
        return _PortFinder(target.port)
    # Before the engine listens, its command line names it and its port.
    # Written for RE2 (no lookahead), which every command line pattern runs on.
    pattern = rf"(?:{words}).*--port[= ]{target.port}(?:\D|$)"
    return _PortThenCmdlineFinder(_PortFinder(target.port), _CmdlineFinder(pattern))


class _PortThenCmdlineFinder(_Walked):
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


class _CgroupFinder:
    """A cgroup's members: the main process is the oldest whose parent is outside it.

    Subclasses say where the cgroup is (``_locate``); its directory is kept while it exists.
    While it is absent, the hierarchy is walked every tick when ``_WALK_WHILE_ABSENT``, else
    on the first tick and then on full ticks only.
    """

    _WALK_WHILE_ABSENT: bool = True

    def __init__(self, cgroup_root: str) -> None:
        self._root = cgroup_root
        self._dir: str | None = None
        self._searched = False
        self._pids: list[int] = []

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """Read the cgroup's processes; keep the tracked main process while it lives in it."""
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

    def gone(self) -> Gone | None:
        """None: a cgroup's ended members are gone from it."""
        return None

    def members(self) -> list[int] | None:
        """Every process of the cgroup and its subgroups, read by the last ``find``."""
        return self._pids

    def _read_procs(self, full: bool) -> list[int]:
        if self._dir is None or not os.path.isdir(self._dir):
            eager = self._dir is None and (self._WALK_WHILE_ABSENT or not self._searched)
            self._dir = self._locate(walk=full or eager)
            self._searched = True
        if self._dir is None:
            return []
        pids: dict[int, None] = {}
        for top, _dirs, _files in os.walk(self._dir):
            pids.update(dict.fromkeys(_read_pids(os.path.join(top, "cgroup.procs"))))
        return list(pids)

    def _locate(self, *, walk: bool) -> str | None:
        """The cgroup's directory, or None; ``walk`` allows searching the hierarchies."""
        raise NotImplementedError


class _UnitFinder(_CgroupFinder):
    """A systemd unit's cgroup, in system.slice or, walking, in nested slices."""

    def __init__(self, unit: str, cgroup_root: str) -> None:
        super().__init__(cgroup_root)
        self._name = unit if "." in unit else f"{unit}.service"

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The unit's main process; a name that would leave the cgroup tree is refused."""
        if "/" in self._name or self._name.startswith(".."):
            raise SourceError(ProcessError.INVALID_FINDER, "unit name must not contain '/'")
        return super().find(tracked, full)

    def _locate(self, *, walk: bool) -> str | None:
        for hierarchy in _CGROUP_HIERARCHIES:
            path = os.path.join(self._root, hierarchy, "system.slice", self._name)
            if os.path.isdir(path):
                return path
        if not walk:
            return None
        for hierarchy in _CGROUP_HIERARCHIES:
            base = os.path.join(self._root, hierarchy)
            if found := _find_dir(base, lambda name: name == self._name, _nests_units):
                return found
        return None


class _ContainerFinder(_CgroupFinder):
    """A container's cgroup, by its ID (full or the 12-character short form).

    Found wherever its runtime puts it: kubelet's pod slices or ``kubepods/<qos>/pod<uid>``,
    ``docker/``, ``system.slice/docker-ID.scope``, Podman's ``machine.slice/libpod-ID.scope``
    or a rootless user's slice. A container that restarts keeps its ID and its directory;
    a new one has a new ID (a discovered target then names the new one).

    The walk covers every pod on the node, so a container not there (gone, within its
    target's grace) is looked for on full ticks only: the runtime reports an ID only once
    the container's cgroup exists, so the first look finds a new one.
    """

    _WALK_WHILE_ABSENT = False

    def __init__(self, container_id: str, cgroup_root: str) -> None:
        super().__init__(cgroup_root)
        self._id = container_id.lower()

    def _locate(self, *, walk: bool) -> str | None:
        if not walk or not self._id:
            return None  # "": not created yet, and every ID starts with ""
        for hierarchy in _CONTAINER_HIERARCHIES:
            base = os.path.join(self._root, hierarchy)
            if found := _find_dir(base, self._is_mine, _nests_containers, _CONTAINER_DEPTH):
                return found
        return None

    def _is_mine(self, name: str) -> bool:
        found = container_id_of(name)
        return found is not None and found.startswith(self._id)


def _read_pids(path: str) -> list[int]:
    try:
        with open(path, encoding="ascii") as f:
            return [int(word) for word in f.read().split()]
    except FileNotFoundError:
        return []  # the cgroup went away with the unit
    except PermissionError as exc:
        raise SourceError(ProcessError.PERMISSION_DENIED, "cgroup.procs unreadable") from exc


def _nests_units(name: str) -> bool:
    """Slices and user managers hold units."""
    return name.endswith(".slice") or name.startswith("user@")


def _nests_containers(name: str) -> bool:
    """What holds containers: slices, user managers, kubelet's cgroupfs QoS and pod groups."""
    return _nests_units(name) or name in _CONTAINER_PARENTS or pod_uid_of(name) is not None


def _find_dir(
    base: str,
    wanted: Callable[[str], bool],
    nests: Callable[[str], bool],
    depth: int = _SLICE_DEPTH,
) -> str | None:
    """The first directory under ``base`` whose name is ``wanted``, ``depth`` levels down.

    Each level is searched before the groups that ``nests`` admits are entered, so the
    shallowest match wins.
    """
    try:
        entries = [e for e in os.scandir(base) if e.is_dir()]
    except OSError:
        return None
    for entry in entries:
        if wanted(entry.name):
            return entry.path
    if depth == 0:
        return None
    for entry in entries:
        if nests(entry.name) and (found := _find_dir(entry.path, wanted, nests, depth - 1)):
            return found
    return None


class _PidfileFinder(_Walked):
    """A pidfile written by the server or its supervisor."""

    def __init__(self, path: str, target: str) -> None:
        self._path = path
        self._target = target
        self._warned = False
        #: The pidfile as it was when it named the tracked process.
        self._read_as: FileIdentity | None = None
        self._named: int | None = None
        self._gone: Gone | None = None

    def find(self, tracked: psutil.Process | None, full: bool) -> psutil.Process | None:
        """The process the pidfile names; a missing file or dead pid is absence.

        While the tracked process lives and the file is as it was when it named it (inode,
        size, mtime), the file is not read again but on full ticks: a stat, not an open.
        """
        before = file_identity(self._path)  # before any read: a rewrite after it reads anew
        self._gone = None
        kept = self._read_as is not None and before == self._read_as
        if kept and tracked is not None and not full and _alive(tracked):
            return tracked
        found = self._read(tracked)
        named = found is not None and found.pid == self._named
        self._read_as = before if named else None
        if found is None and self._named is not None and before is not None:
            self._gone = Gone(self._named, before.mtime_ns / 1e9)
        return found

    def gone(self) -> Gone | None:
        """The pid the file named at the last ``find`` when no such process was left."""
        return self._gone

    def _read(self, tracked: psutil.Process | None) -> psutil.Process | None:
        try:
            with open(self._path, encoding="ascii", errors="replace") as f:
                text = f.read(64)
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise SourceError(ProcessError.PERMISSION_DENIED, "pidfile unreadable") from exc
        pid = self._named = _parse_pid(text)
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


class _CmdlineFinder(_Walked):
    """A regex over the joined command line; scans /proc only while nothing is tracked.

    Pids whose command line did not match are not read again until a full tick, so an idle
    host costs one ``listdir(/proc)`` a tick; a process that ``exec``s into a matching
    command line is found within ``rescan_every`` ticks.
    """

    def __init__(self, pattern: str) -> None:
        self._source = pattern
        self._pattern: UserRegex | None = None
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
        if not matches and proc_hides_pids():
            raise SourceError(ProcessError.NOT_VISIBLE, "/proc hides other users' processes")
        return _oldest_root(matches)

    def _compiled(self) -> UserRegex:
        # RE2, as the config checked it: a command line is the user's and anyone's to shape,
        # and a backtracking pattern over it would freeze the loop.
        if self._pattern is None:
            try:
                self._pattern = UserRegex(self._source)
            except ValueError as exc:
                raise SourceError(ProcessError.INVALID_FINDER, "cmdline regex invalid") from exc
        return self._pattern


def _cmdline_matches(proc: psutil.Process, pattern: UserRegex) -> bool:
    try:
        words = proc.cmdline()
    except psutil.Error:
        return False  # ended, a zombie, or refused
    return bool(words) and pattern.search(" ".join(words)) is not None


class _PortFinder(_Walked):
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
    return (int(name) for name in os.listdir(PROC) if name.isdigit())


def _holds_socket(pid: int, links: set[str]) -> bool:
    fd_dir = f"{PROC}/{pid}/fd"
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


def gone_of(main: psutil.Process) -> Gone | None:
    """A found process that ended before it could be read, with its start time."""
    try:
        # psutil keeps the start time from when it found the process, counted from /proc/stat's
        # whole-second boot time: recounted from the exporter's, as a tree's start is.
        started = main.create_time() - psutil.boot_time() + boot_epoch()
        return Gone(main.pid, started, slack_seconds=SAME_START_SECONDS)
    except psutil.Error:
        return None


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
