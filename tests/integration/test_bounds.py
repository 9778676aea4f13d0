"""What bounded each phase, end to end: a simulator scenario per bound, the real exporter.

Both are real child processes on loopback; the weights are real files read from this box's
disk (O_DIRECT) or, warm, from its page cache. GPU utilisation comes from the simulated
libnvidia-ml.so.1 through the real pynvml binding. Each bound is asserted in ``/status``,
in ``/metrics`` and in the page's script, which draws it from the same document.
"""

from __future__ import annotations

import re

import pytest

from tests.integration.harness import exporter, simulated_nvml, simulator, target_toml

pytestmark = pytest.mark.integration
INTERVAL = 0.25


def _judged(t, phase):
    rows = [b for b in t["last_start_bounds"] if b["phase"] == phase]
    return rows[0] if rows else None


# scenario, simulator knobs, the phase, its bound, words of its advice
FINISHED = [
    ("healthy", {"weights_mb": 48, "read_mbps": 24.0}, "loading", "disk", "disk-bound"),
    ("throttled-disk", {"weights_mb": 32, "read_mbps": 32.0}, "loading", "disk", "disk-bound"),
    ("warm-cache", {"weights_mb": 48, "read_mbps": 24.0}, "loading", "page_cache", "warm start"),
    ("compile", {}, "initializing", "cpu", "cores busy, no reads"),
    ("gpu-warmup", {}, "initializing", "gpu", "gpu-bound (graph capture, warm-up)"),
    ("rendezvous", {}, "starting", "peers", "store based barrier"),
    ("download", {"weights_mb": 16, "read_mbps": 8.0}, "downloading", "network", "downloaded"),
]


@pytest.mark.parametrize(("scenario", "knobs", "phase", "bound", "words"), FINISHED)
def test_each_scenario_finishes_with_its_bound_in_status_and_metrics(
    tmp_path, nvml_dir, scenario, knobs, phase, bound, words
):
    with (
        simulator(tmp_path, scenario=scenario, gpus=1, launch=False, **knobs) as sim,
        exporter(
            tmp_path,
            target_toml("llm", sim, completion=False),
            interval=INTERVAL,
            **simulated_nvml(sim.gpu_state, nvml_dir),
        ) as exp,
    ):
        sim.launch()  # once the exporter watches: the whole start is seen
        ready = exp.wait_for(lambda t: t["phase"] == "ready" and t["last_start_bounds"], "llm")
        judged = _judged(ready, phase)
        assert judged is not None, ready["last_start_bounds"]
        assert judged["bound"] == bound, judged
        assert words in judged["advice"], judged["advice"]
        assert judged["advice"].startswith(phase + " ")
        if scenario == "throttled-disk":  # a quarter of --read-mbps, not the healthy rate
            assert judged["read_bytes_per_second"] < 16 * 2**20, judged["advice"]
        assert ready["bounds"] == []  # no start is running any more
        found = re.search(
            rf'inference_server_cold_start_phase_seconds\{{bound="(\w+)",phase="{phase}",'
            rf'target="llm"\}} (\S+)',
            exp.metrics(),
        )
        assert found and found.group(1) == bound and float(found.group(2)) > 0
        assert "inference_server_phase_bound{" not in exp.metrics()  # between starts


def test_a_hung_load_reads_idle_while_it_runs_and_the_state_set_says_so(tmp_path):
    with (
        simulator(
            tmp_path, scenario="hang-loading", weights_mb=64, read_mbps=16.0, launch=False
        ) as sim,
        exporter(tmp_path, target_toml("llm", sim, completion=False), interval=INTERVAL) as exp,
    ):
        sim.launch()
        reading = exp.wait_for(lambda t: _running(t, "loading") == "disk", "llm", timeout=30)
        assert "disk-bound" in reading["bounds"][-1]["advice"]
        hung = exp.wait_for(lambda t: _running(t, "loading") == "idle", "llm", timeout=40)
        assert "nothing busy for" in hung["bounds"][-1]["advice"]
        metrics = exp.metrics()
        assert 'inference_server_phase_bound{bound="idle",target="llm"} 1.0' in metrics
        assert 'inference_server_phase_bound{bound="disk",target="llm"} 0.0' in metrics


def _running(t, phase):
    rows = t["bounds"]
    if not rows or not rows[-1]["running"] or rows[-1]["phase"] != phase:
        return None
    return rows[-1]["bound"]
