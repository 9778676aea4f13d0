"""The simulated engine's worker process: one tensor-parallel rank, run by the main process.

Started as ``python -m exporter.simulate.worker PLAN_JSON``. It reads its share of the weights at a
set rate, bypassing the page cache so the reads show in its ``/proc/PID/io`` ``read_bytes``, keeps
what it read (RSS grows), reports progress on stdout and idles until stdin closes. It never writes
engine log lines; the main process does.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Final

from exporter.simulate.plan import ALIGN, WorkerPlan, chunk_size

#: prctl(2) option: signal this process when its parent dies.
_PR_SET_PDEATHSIG: Final = 1


def main(argv: list[str] | None = None) -> int:
    """Run one worker: wait for ``load`` on stdin, read, then idle until stdin closes."""
    args = sys.argv[1:] if argv is None else argv
    plan = WorkerPlan.from_json(args[0])
    _die_with_parent()
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        if os.getppid() != plan.parent:
            return 0
        held = _load(plan) if sys.stdin.readline().strip() == "load" else []
        sys.stdin.read()  # idle, holding the weights, until the parent closes the pipe
        del held
    except BrokenPipeError:
        pass
    finally:
        if os.getppid() != plan.parent:
            _clean_up_after(plan)
    return 0


def _die_with_parent() -> None:
    # Real TP workers die with their engine; a stdin EOF or EPIPE is the fallback without prctl.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _load(plan: WorkerPlan) -> list[bytes]:
    """Read this worker's chunks of every segment at its rate; returns what it read."""
    held: list[bytes] = []
    total = 0
    started = time.monotonic()
    chunk = chunk_size(plan.bytes_per_second)
    buf = mmap.mmap(-1, chunk)  # page aligned, as O_DIRECT requires
    for index, seg in enumerate(plan.segments):
        fd = _open_cold(seg.path)
        try:
            end = seg.offset + seg.length
            for offset in range(seg.offset + plan.rank * chunk, end, plan.world * chunk):
                if plan.stop_after is not None and total >= plan.stop_after:
                    return held
                got = os.preadv(fd, [memoryview(buf)[: min(chunk, end - offset)]], offset)
                held.append(buf[:got])
                total += got
                _report(f"bytes {total}")
                _pace(started, total, plan.bytes_per_second)
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


def _pace(started: float, done: int, bytes_per_second: float) -> None:
    ahead = started + done / bytes_per_second - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)


def _report(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _clean_up_after(plan: WorkerPlan) -> None:
    for path in plan.cleanup:
        path.unlink(missing_ok=True)
    if plan.cleanup_dir is not None:
        with contextlib.suppress(OSError):
            plan.cleanup_dir.rmdir()


if __name__ == "__main__":
    raise SystemExit(main())
