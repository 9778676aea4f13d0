"""Process-tree source: finds a target's main process and sums RSS, CPU and read bytes of its tree.

I/O only. No full host scan while the main process is known, and never a command line in a
log line, an error or a sample. Finding the main process lives in ``finding``, tracking its
tree in ``tree`` and reading /proc in ``procfs``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Final

from exporter.base.model import ProcessSample
from exporter.config import Target
from exporter.sources import TargetSeen
from exporter.sources.process.downloads import DownloadWatch
from exporter.sources.process.finding import Gone, finder_inputs, gone_of, make_finder
from exporter.sources.process.procfs import ProcessError, Reading
from exporter.sources.process.tree import Tree

__all__ = ["DEFAULT_CGROUP_ROOT", "DEFAULT_RESCAN_EVERY", "ProcessError", "ProcessSource"]

log = logging.getLogger(__name__)

DEFAULT_CGROUP_ROOT: Final = "/sys/fs/cgroup"
DEFAULT_RESCAN_EVERY: Final = 10
#: While the server is at rest, a member whose counters stood still is read again after this.
QUIET_REREAD_SECONDS: Final = 10.0


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

    Once the core saw the server at rest (``TargetSeen.at_rest``: ready, serving or asleep), the
    tree is no longer the progress signal: members that stood still at their last read are
    read again only every ``QUIET_REREAD_SECONDS`` (most of a tree: compile and tokenizer
    workers), while the main process and members that move are read every tick. A quiet
    member that ends is still seen on the next tick: its pidfd turns readable.
    """

    name: Final = "process"

    def __init__(
        self,
        target: Target,
        *,
        cgroup_root: str = DEFAULT_CGROUP_ROOT,
        rescan_every: int = DEFAULT_RESCAN_EVERY,
    ) -> None:
        self.target = target
        self._finder = make_finder(target, cgroup_root)
        self._rescan_every = max(1, rescan_every)
        self._key = ("process", finder_inputs(target), cgroup_root, self._rescan_every)
        self._ticks = 0
        self._tree: Tree | None = None
        self._io_error: str | None = None
        self._downloads = DownloadWatch()
        self._sampled_at: float | None = None
        self._told: Gone | None = None

    @property
    def share_key(self) -> tuple[object, ...]:
        """Targets that find their process alike read one tree (``daemon.shared``)."""
        return self._key

    def sample(
        self, deadline: float | None = None, seen: TargetSeen | None = None
    ) -> ProcessSample | None:
        """The tree now, or None when no process is found (a valid observation).

        A process that started since the last sample but had ended when it was looked for
        (its pidfile names a pid already gone, or it ended before it could be read) is a
        sample with ``zombie`` set: its start is over, the core fails it.

        Its reads of /proc do not block, so ``deadline`` needs no checks. ``seen`` says
        whether the server is at rest (quiet members are then read less often).

        Raises:
            SourceError: the source cannot observe at all ("permission_denied" when /proc
                refuses, "not_visible" when /proc hides the target, "invalid_finder").
        """
        self._ticks += 1
        full = self._ticks % self._rescan_every == 0
        last, self._sampled_at = self._sampled_at, time.time()
        main = self._finder.find(self._tree.main if self._tree else None, full)
        if main is None:
            self._forget()
            return self._ended_unsampled(self._finder.gone(), last)
        if self._tree is None or self._tree.main != main:
            self._forget()
            self._tree = Tree.adopt(main)
            if self._tree is None:
                return self._ended_unsampled(gone_of(main), last)
            full = True
            log.info("process found target=%s pid=%d", self.target.name, main.pid)
        self._tree.refresh(self._finder.members(), full=full)
        quiet_every = QUIET_REREAD_SECONDS if seen is not None and seen.at_rest else None
        readings = self._tree.read(full=full, steady_every=quiet_every)
        if main.pid not in readings:
            self._forget()  # the main process ended while being read
            return self._ended_unsampled(gone_of(main), last)
        sample = _summarise(self._tree, readings)
        self._note_io(sample.read_bytes_error)
        downloads = self._downloads.count(sample.pids, sample.write_bytes)
        return replace(sample, download_files=downloads) if downloads else sample

    def _ended_unsampled(self, gone: Gone | None, last: float | None) -> ProcessSample | None:
        """A process started since the last sample and ended before it: a dead sample.

        Only a start after the last sample counts (a pidfile left naming a pid that ended
        long ago is absence).
        """
        if gone is None or last is None or gone.started_by < last - gone.slack_seconds:
            return None
        if gone == self._told:
            return None  # within the slack of the sample that told of it already
        self._told = gone
        log.info("process ended unsampled target=%s pid=%d", self.target.name, gone.pid)
        return ProcessSample(
            pid=gone.pid,
            create_time=gone.started_by,
            pids=(gone.pid,),
            rss_bytes=0,
            cpu_seconds=0.0,
            read_bytes=None,
            zombie=True,
        )

    def close(self) -> None:
        """Close the descriptors kept on the tree's /proc files."""
        if self._tree is not None:
            self._tree.close()
            self._tree = None

    def _forget(self) -> None:
        if self._tree is not None:
            log.info("process gone target=%s pid=%d", self.target.name, self._tree.main.pid)
            self._tree.close()
        self._tree = None
        self._downloads = DownloadWatch()

    def _note_io(self, error: str | None) -> None:
        if error != self._io_error and error is not None:
            log.warning("read bytes unavailable target=%s reason=%s", self.target.name, error)
        elif error != self._io_error:
            log.info("read bytes available target=%s", self.target.name)
        self._io_error = error


def _summarise(tree: Tree, readings: dict[int, Reading]) -> ProcessSample:
    """Sum the readings into one sample; one refused read_bytes makes the sum unknown.

    One pass over the readings: this runs for every target every tick, over up to hundreds of
    members, and six generator passes cost a third of a tree at rest.
    """
    main = tree.main
    rss = read = write = 0
    cpu = 0.0
    io_errors: set[ProcessError] = set()
    for r in readings.values():
        rss += r.rss
        cpu += r.cpu
        read += r.read_bytes or 0
        write += r.write_bytes or 0
        if r.io_error:
            io_errors.add(r.io_error)
    others = sorted(readings)
    others.remove(main.pid)  # the caller checked it is there
    first_error = min(io_errors) if io_errors else None
    known = first_error is None
    return ProcessSample(
        pid=main.pid,
        create_time=tree.create_time,
        pids=(main.pid, *others),
        rss_bytes=rss,
        cpu_seconds=cpu,
        read_bytes=read if known else None,
        read_bytes_error=None if first_error is None else str(first_error),
        zombie=readings[main.pid].zombie,
        write_bytes=write if known else None,
    )
