"""The simulated engine's worker process: one tensor-parallel rank, run by the main process.

Started as ``python -m exporter_tooling.simulate.worker PLAN_JSON``. It reads its share of the
weights at a set rate, bypassing the page cache so the reads show in its ``/proc/PID/io``
``read_bytes``, keeps what it read (RSS grows), reports progress on stdout and idles until stdin
closes. It never writes engine log lines; the main process does.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Final

from exporter_tooling.simulate.gpustate import write_gpu_state
from exporter_tooling.simulate.plan import ALIGN, WorkerPlan, chunk_size

#: prctl(2) option: signal this process when its parent dies.
_PR_SET_PDEATHSIG: Final = 1


class _Stopped(Exception):
    """A ``stop`` command (the parent is shutting down) or a bare SIGTERM (``requested`` False)."""

    def __init__(self, requested: bool) -> None:
        super().__init__()
        self.requested = requested


class _ParentGone(Exception):
    """stdin closed without ``stop``, or stdout broke: the parent died."""


class _Commands:
    """stdin command lines and SIGTERM, waited on together in one ``select``.

    The SIGTERM handler never raises: a signal landing in the middle of the orphan cleanup must
    not cut it short. It only wakes the ``select`` through ``signal.set_wakeup_fd``.
    """

    def __init__(self) -> None:
        self._wake, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, _note_signal)
        self._pending = b""
        self._eof = False

    def next(self, timeout: float | None) -> str | None:
        """The next command, or None when ``timeout`` passes first.

        Raises:
            _Stopped: SIGTERM arrived, or the command was ``stop``.
            _ParentGone: stdin closed without ``stop``.
        """
        while b"\n" not in self._pending and not self._eof:
            ready, _, _ = select.select([0, self._wake], [], [], timeout)
            if self._wake in ready:
                raise _Stopped(requested=False)
            if not ready:
                return None
            self._read()
        if b"\n" not in self._pending:
            raise _ParentGone
        line, _, self._pending = self._pending.partition(b"\n")
        if line == b"stop":
            raise _Stopped(requested=True)
        return line.decode()

    def parent_dying(self, timeout: float) -> bool:
        """After a bare SIGTERM: whether stdin ends without ``stop`` (the parent is dying).

        The parent writes ``stop`` before its own SIGTERM. The kernel's parent-death signal also
        fires when only the parent's *thread* that spawned us exits, before the process is gone
        (prctl(2)), so that signal alone proves nothing: the pipe closing does.
        """
        deadline = time.monotonic() + timeout
        while b"stop\n" not in self._pending and not self._eof:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([0], [], [], left)[0]:
                return False
            self._read()
        return b"stop\n" not in self._pending

    def _read(self) -> None:
        chunk = os.read(0, 4096)
        self._eof = not chunk
        self._pending += chunk


def _note_signal(signum: int, frame: FrameType | None) -> None:
    pass  # the wakeup fd carries it to _Commands.next


def main(argv: list[str] | None = None) -> int:
    """Run one worker: wait for ``load`` on stdin, read, then idle until ``stop`` or SIGTERM."""
    args = sys.argv[1:] if argv is None else argv
    plan = WorkerPlan.from_json(args[0])
    if not plan.linger_seconds:
        _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process to handle
    commands = _Commands()
    try:
        if commands.next(None) == "load":
            _weights = _load(plan, commands)  # kept referenced: RSS stays up while idle
            while True:
                commands.next(None)
    except _Stopped as stop:
        orphaned = not stop.requested and commands.parent_dying(timeout=2.0)
    except (_ParentGone, BrokenPipeError):
        orphaned = True
    if orphaned:
        with contextlib.suppress(OSError):
            # Nobody reads our stdout any more; spare stderr the flush-at-exit BrokenPipeError.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        _linger(plan)
        _clean_up_if_orphaned(plan)
    return 0


def _linger(plan: WorkerPlan) -> None:
    """A worker left behind: hold the GPU a while, then free it as the driver would."""
    if not plan.linger_seconds:
        return
    time.sleep(plan.linger_seconds)
    if plan.gpu_state is not None:
        with contextlib.suppress(OSError):
            text = plan.gpu_state.read_text()
            kept = [ln for ln in text.splitlines() if not ln.startswith("proc ")]
            write_gpu_state(plan.gpu_state, "\n".join(kept) + "\n")


def _clean_up_if_orphaned(plan: WorkerPlan) -> None:
    """Once the parent's death is certain (we were re-parented), remove its weight files."""
    # The parent's pipes close before the kernel re-parents us to another process.
    deadline = time.monotonic() + 2.0
    while os.getppid() == plan.parent:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    for path in plan.cleanup:
        path.unlink(missing_ok=True)
    if plan.cleanup_dir is not None:
        with contextlib.suppress(OSError):
            plan.cleanup_dir.rmdir()


def _die_with_parent() -> None:
    # Real TP workers die with their engine; a stdin EOF or EPIPE is the fallback without prctl.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _load(plan: WorkerPlan, commands: _Commands) -> list[bytes]:
    """Read this worker's chunks of every segment at its rate; returns what it read."""
    held: list[bytes] = []
    total = 0
    started = time.monotonic()
    chunk = chunk_size(plan.bytes_per_second)
    buf = mmap.mmap(-1, chunk)  # page aligned, as O_DIRECT requires
    for index, seg in enumerate(plan.segments):
        fd = os.open(seg.path, os.O_RDONLY) if plan.warm else _open_cold(seg.path)
        try:
            end = seg.offset + seg.length
            for offset in range(seg.offset + plan.rank * chunk, end, plan.world * chunk):
                if plan.stop_after is not None and total >= plan.stop_after:
                    return held
                got = os.preadv(fd, [memoryview(buf)[: min(chunk, end - offset)]], offset)
                held.append(buf[:got])
                total += got
                _report(f"bytes {total}")
                _pace(started + total / plan.bytes_per_second, commands)
        finally:
            os.close(fd)
        _report(f"done {index}")
    return held


def _open_cold(path: Path) -> int:
    """Open for reads that reach the disk: O_DIRECT, else drop the file's cached pages first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:  # tmpfs refuses O_DIRECT
        fd = -1
    if fd >= 0 and _direct_reads_work(fd):
        return fd
    if fd >= 0:
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd


def _direct_reads_work(fd: int) -> bool:
    # Some file systems accept O_DIRECT at open and refuse it at the first read.
    try:
        os.preadv(fd, [mmap.mmap(-1, ALIGN)], 0)
    except OSError:
        return False
    return True


def _pace(until: float, commands: _Commands) -> None:
    while (ahead := until - time.monotonic()) > 0:
        commands.next(ahead)


def _report(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
