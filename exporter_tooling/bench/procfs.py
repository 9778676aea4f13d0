"""What the bench reads of the processes it measures: CPU, resident memory, children.

Through psutil, the /proc library the product's sources use, so the bench keeps no parser of its
own; every reader answers 0 (or no children) for a process that is gone.
"""

from __future__ import annotations

import psutil


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


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
