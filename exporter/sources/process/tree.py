"""Tree tracking of the process source: one main process and the descendants adopted since.

New children are looked for only among the pids allocated since the last tick, or, when
there are too many, in ``/proc/PID/task/TID/children``.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Sequence
from typing import Final

import psutil

from exporter.sources.process.exits import ExitWatch
from exporter.sources.process.procfs import (
    PROC,
    Member,
    Reading,
    parent_of,
    pids_are_ours,
    read_all,
    start_epoch,
)

# New pids checked one by one up to this many (or the tree's size); past it, children files.
_MIN_PID_RANGE: Final = 256
_PID_RECHECK: Final = 8


class _SharedParents:
    """The parents of new pids, read once a moment for every tree of the daemon.

    Every tree looks at the same new pids each tick (whoever forked them), so without this a
    host with T targets and P new pids a tick reads T x P stat files (issue 18: the 64-target
    row). An answer is kept far less than a tick, so a pid not there yet is read again next
    tick, and a stale parent cannot adopt a stranger: ``Member.open`` checks the real one.
    """

    def __init__(self, seconds: float = 0.1, limit: int = 8192) -> None:
        self._seconds = seconds
        self._limit = limit
        self._lock = threading.Lock()
        self._parents: dict[int, tuple[float, int | None]] = {}

    def of(self, pid: int) -> int | None:
        """``parent_of(pid)``, or the answer another tree got a moment ago."""
        now = time.monotonic()
        with self._lock:
            kept = self._parents.get(pid)
        if kept is not None and now - kept[0] < self._seconds:
            return kept[1]
        parent = parent_of(pid)
        with self._lock:
            if len(self._parents) >= self._limit:
                self._parents = {
                    p: v for p, v in self._parents.items() if now - v[0] < self._seconds
                }
            self._parents[pid] = (now, parent)
        return parent


_PARENTS: Final = _SharedParents()


class Tree:
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
        self.members: dict[int, Member] = {}
        self._last_pid: int | None = None
        self._recheck: list[int] = []
        self._steady = False
        self._exits = ExitWatch()

    @classmethod
    def adopt(cls, main: psutil.Process) -> Tree | None:
        """A new tree rooted at ``main``, or None when it ended before it could be read."""
        member = Member.open(main.pid)
        if member is None:
            return None
        tree = cls(main, start_epoch(member.start))
        tree.members[main.pid] = member
        return tree

    def close(self) -> None:
        """Give back every kept descriptor."""
        self._exits.close()
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

    def read(self, *, full: bool, steady_every: float | None = None) -> dict[int, Reading]:
        """Read the members; a process that ended (or whose pid was reused) is dropped.

        With ``steady_every`` (seconds; a server at rest), a member whose counters did not
        move at its last read keeps that reading and is read again only after that long (the
        first time after a part of it spread by pid, so a tree's reads spread over ticks),
        or at once when its pidfd says it ended; the main process, members that move, zombies
        and members without a pidfd are read every tick.
        """
        now = time.monotonic()
        if steady_every is not None:
            for pid in self._exits.ended():
                self._exits.unwatch(pid)
                self.members[pid].due_at = 0.0  # read now: a zombie's last reading, or gone
        readings: dict[int, Reading] = {}
        for pid, member in list(self.members.items()):
            last = member.last
            if steady_every is not None and last is not None and now < member.due_at:
                readings[pid] = last
                continue
            reading = member.read(retry_io=full)
            if reading is None:
                self._drop(pid)
                continue
            readings[pid] = reading
            if steady_every is not None and pid != self.main.pid:
                member.due_at = self._next_read(member, reading, now, steady_every)
        if steady_every is None and self._steady:
            self._exits.close()
            for member in self.members.values():
                member.due_at = 0.0  # steady again later: spread anew
        self._steady = steady_every is not None
        return readings

    def _next_read(self, member: Member, reading: Reading, now: float, every: float) -> float:
        """When a steady tree reads ``member`` again: next tick, unless it is quiet and watched."""
        if member.moved or reading.zombie or not self._watch_exit(member):
            self._exits.unwatch(member.pid)
            return 0.0
        if member.due_at == 0.0:  # newly quiet: a part of ``every`` spread by pid
            return now + every * (member.pid % 61 + 1) / 61
        return now + every

    def _watch_exit(self, member: Member) -> bool:
        """Whether ``member``'s end will show in ``ExitWatch.ended`` (its pidfd is open)."""
        if self._exits.watching(member.pid):
            return True
        # Checked after the pidfd is open: a pid freed and reused just before is not ours.
        return self._exits.watch(member.pid) and member.still_there()

    def _add(self, pid: int, *, child: bool = True) -> bool:
        member = Member.open(pid)
        if member is None:
            return False
        if child and member.ppid not in self.members:
            member.close()  # ended and its pid reused between the listing and the open
            return False
        self.members[pid] = member
        return True

    def _drop(self, pid: int) -> None:
        self._exits.unwatch(pid)
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
        self._adopt_descendants(self._parents_of_new(new))
        return True

    def _parents_of_new(self, new: Sequence[int]) -> dict[int, int]:
        """The parent of each new pid (and of those rechecked) that is not a member yet."""
        # A pid is allocated a moment before its process shows in /proc: the last few pids
        # that were not there yet are looked at once more next tick.
        candidates, self._recheck = [*self._recheck, *new], []
        parents = {}
        for pid in candidates:
            if pid in self.members:
                continue
            parent = _PARENTS.of(pid)
            if parent is not None:
                parents[pid] = parent
            elif pid in new[-_PID_RECHECK:]:
                self._recheck.append(pid)
        return parents

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


def _children(pid: int, *, all_threads: bool) -> list[int]:
    """Direct children of ``pid``: forked by its main thread, or by any of its threads."""
    try:
        tids = os.listdir(f"{PROC}/{pid}/task") if all_threads else [str(pid)]
    except OSError:
        return []
    children: list[int] = []
    for tid in tids:
        try:
            raw = read_all(f"{PROC}/{pid}/task/{tid}/children")
        except OSError:
            continue  # thread or process ended
        children.extend(int(word) for word in raw.split())
    return children


def _last_pid() -> int | None:
    """The pid the kernel allocated last in our namespace; None when /proc is another's."""
    if not pids_are_ours():
        return None
    try:
        with open(f"{PROC}/loadavg", "rb") as f:
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
def _pid_max() -> int:
    try:
        with open(f"{PROC}/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4_194_304  # the kernel's ceiling


@functools.cache
def _children_files_supported() -> bool:
    return os.path.exists(f"{PROC}/self/task/{os.getpid()}/children")
