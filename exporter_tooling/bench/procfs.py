"""What the bench reads of the processes it measures: CPU, resident memory, children.

CPU and memory through psutil, the /proc library the product's sources use, so the bench keeps
no parser of its own; every reader answers 0 (or no children) for a process that is gone.
"""

from __future__ import annotations

import contextlib
import os

import psutil


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's), from /proc/PID/task/*/children.

    Not psutil's ``children()``: it reads every process's stat file, a thousand reads at each
    window edge of a full run on the very box whose CPU is being measured.
    """
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(word) for word in f.read().split())
    return found


def cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid``, its reaped children included, in seconds."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system + times.children_user + times.children_system


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` itself (VmRSS)."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0
