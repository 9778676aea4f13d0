"""A bounded soak: back-to-back fast simulated cold starts (and crashes) under scrapes; the
exporter's open files and memory stay flat. The longer soak figures are in the README."""

from __future__ import annotations

import os
import time

import pytest

from tests.integration.harness import exporter, simulator, target_toml

pytestmark = pytest.mark.integration
SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "40"))


def usage(pid: int) -> tuple[int, int]:
    """Open file descriptors and resident kB of a process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return fds, rss


def gone(t: dict[str, object]) -> bool:
    """The engine's start is over and its process is no longer tracked."""
    return t["phase"] in ("down", "failed") and not t["process"]


def test_repeated_cold_starts_leave_files_and_memory_flat(tmp_path):
    first = None
    starts = 0
    with (
        simulator(
            tmp_path, weights_mb=4, read_mbps=32, start_seconds=0.2, init_seconds=0.2, launch=False
        ) as sim,
        exporter(tmp_path, target_toml("soak", sim), interval=0.25) as exp,
    ):
        deadline = time.monotonic() + SOAK_SECONDS
        while time.monotonic() < deadline:
            scenario = "crash-loading" if starts % 4 == 3 else "healthy"
            sim.command[sim.command.index("--scenario") + 1] = scenario
            sim.launch()
            want = "failed" if scenario == "crash-loading" else "serving"
            exp.wait_for(lambda t, want=want: t["phase"] == want, "soak", timeout=30)
            for _ in range(20):
                exp.metrics()
                exp.status()
            assert sim.proc is not None
            sim.proc.terminate()
            sim.proc.wait(timeout=10)
            assert sim.proc.stdout is not None
            sim.proc.stdout.close()
            # Gone, not only judged: a crashed start is "failed" before its process exits,
            # and a tree still tracked holds its /proc descriptors.
            exp.wait_for(gone, "soak", timeout=10)
            starts += 1
            if starts == 3:
                first = usage(exp.proc.pid)  # after warm-up: caches, threads, history open
        last = usage(exp.proc.pid)
        doc = exp.target("soak")
    print(
        f"soak: starts={starts} open_files {first and first[0]}->{last[0]} "
        f"rss_kB {first and first[1]}->{last[1]}"
    )
    assert starts >= 6, starts
    assert first is not None
    assert last[0] <= first[0] + 3, f"open files grew: {first[0]} -> {last[0]}"
    assert last[1] <= first[1] + 8 * 1024, f"RSS grew: {first[1]} kB -> {last[1]} kB"
    assert doc["restarts"] >= starts - 1
