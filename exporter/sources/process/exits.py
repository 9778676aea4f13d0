"""Exit watch of the process source: pidfds of a tree's quiet members, polled once a tick.

A tree at rest reads its quiet members seldom (``Tree.read``); a pidfd turns readable when
its process ends, so one ``poll`` a tick still sees any of them end on the very next tick,
as reading every member every tick did.
"""

from __future__ import annotations

import contextlib
import os
import select
from typing import Final

from exporter.sources.process.procfs import fd_budget, pids_are_ours

__all__ = ["ExitWatch"]

_PIDFD_OPEN: Final = getattr(os, "pidfd_open", None)  # Linux 5.3+; absent elsewhere


class ExitWatch:
    """The pidfds of one tree's quiet members: which of them ended since the last look.

    A pidfd is taken from the kept-descriptor budget. Where none can be had (no budget left,
    a kernel before 5.3, a seccomp profile that refuses ``pidfd_open``, /proc from another
    pid namespace) ``watch`` says False and the tree reads that member every tick.
    """

    def __init__(self) -> None:
        self._by_pid: dict[int, int] = {}
        self._by_fd: dict[int, int] = {}
        self._poller = select.poll()  # not select: a daemon may hold descriptors past 1024
        # Held here, not looked up at close: __del__ may run while the interpreter exits.
        self._budget = fd_budget()
        self._close = os.close

    def watching(self, pid: int) -> bool:
        """Whether ``pid`` has a pidfd here."""
        return pid in self._by_pid

    def watch(self, pid: int) -> bool:
        """Watch ``pid`` (True), or say that it cannot be watched (False).

        The caller checks after this that its process is still the one it read: a pid freed
        and reused just before the pidfd was opened would otherwise be watched instead.
        """
        if pid in self._by_pid:
            return True
        if _PIDFD_OPEN is None or not pids_are_ours():
            return False
        if not self._budget.take():
            return False
        try:
            fd: int = _PIDFD_OPEN(pid)
        except OSError:
            self._budget.give()
            return False
        self._by_pid[pid], self._by_fd[fd] = fd, pid
        self._poller.register(fd, select.POLLIN)
        return True

    def ended(self) -> list[int]:
        """The watched pids whose process ended (a zombie or reaped); one poll for all."""
        if not self._by_pid:
            return []
        return [self._by_fd[fd] for fd, _events in self._poller.poll(0)]

    def unwatch(self, pid: int) -> None:
        """Close ``pid``'s pidfd, if it has one."""
        fd = self._by_pid.pop(pid, None)
        if fd is None:
            return
        del self._by_fd[fd]
        with contextlib.suppress(KeyError):
            self._poller.unregister(fd)
        self._close(fd)
        self._budget.give()

    def close(self) -> None:
        """Close every pidfd."""
        for pid in list(self._by_pid):
            self.unwatch(pid)

    def __del__(self) -> None:
        # A tree dropped without close() still gives its pidfds back.
        self.close()
