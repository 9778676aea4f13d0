"""Restarts over within a tick (issue 33), with the real simulator and the real exporter.

``simulate --engine llamacpp --start-seconds 0 --init-seconds 0`` is ready a moment after it
starts; killed and started again under a running exporter, most restarts go ``down`` (or
straight from the old pid) to ``ready`` in one tick. Each is still a cold start, timed from
the new process's start, and shows bounds of its own.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.integration.harness import exporter, simulator, target_toml

pytestmark = pytest.mark.integration
INTERVAL = 2.0  # longer than the simulator takes to start: most restarts fit in one tick
RESTARTS = 6


def _cold_starts(metrics: str) -> int:
    m = re.search(
        r'^inference_server_cold_start_duration_seconds_count\{target="fast"\} (\S+)$',
        metrics,
        re.M,
    )
    return int(float(m.group(1))) if m else 0


def test_every_back_to_back_restart_of_a_fast_engine_is_a_timed_cold_start(tmp_path):
    with (
        simulator(
            tmp_path,
            engine="llamacpp",
            weights_mb=1,
            read_mbps=512.0,
            start_seconds=0.0,
            init_seconds=0.0,
            gpus=1,
        ) as sim,
        exporter(
            tmp_path,
            target_toml("fast", sim, engine="llamacpp", completion=False),
            interval=INTERVAL,
        ) as exp,
    ):
        sim.ready_at()
        doc = exp.wait_for(lambda t: t["phase"] == "ready", "fast", timeout=20)
        before = _cold_starts(exp.metrics())  # the first start may or may not have been seen
        starts, bounds = set(), []
        for _ in range(RESTARTS):
            assert sim.proc is not None and sim.proc.stdout is not None
            previous = doc["started_at"]
            sim.proc.send_signal(signal.SIGKILL)
            sim.proc.wait(timeout=10)
            sim.proc.stdout.close()
            sim.launch()  # no pause: the new process is ready before the next tick or two
            sim.ready_at()
            doc = exp.wait_for(
                lambda t, previous=previous: t["phase"] == "ready" and t["started_at"] != previous,
                "fast",
                timeout=20,
            )
            starts.add(doc["started_at"])
            bounds.append(json.dumps(doc["last_start_bounds"]))
            time.sleep(INTERVAL)  # the next restart comes a tick after this one was seen
        assert len(starts) == RESTARTS
        # Each start shows bounds of its own, never the previous start's (issue 32).
        assert "[]" not in bounds and len(set(bounds)) == RESTARTS, bounds
        deadline = time.monotonic() + 5
        while _cold_starts(exp.metrics()) < before + RESTARTS and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _cold_starts(exp.metrics()) == before + RESTARTS, exp.target("fast")["transitions"]
        last = doc["last_cold_start"]
        assert last is not None and last["outcome"] == "ready"
        assert 0.0 <= last["duration_seconds"] < 30.0
        assert doc["timeline"], doc  # wait prints how long it took, not "already up"
