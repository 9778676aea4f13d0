"""Real cgroup directories for tests that put real processes in them (the tests run as root)."""

from __future__ import annotations

import time
from pathlib import Path


def cgroup_hierarchies() -> list[str]:
    """Mounted hierarchies systemd puts units in: cgroup2 (unified) and v1 name=systemd."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            point, (fstype, _source, options) = head.split()[4], tail.split()[:3]
            if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options):
                found.append(point)
    return found


def rmdir_when_empty(path: Path) -> None:
    """Remove an emptied cgroup, waiting for killed members to be reaped out of it."""
    deadline = time.monotonic() + 10
    while path.exists():
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # killed members leave the cgroup when reaped
