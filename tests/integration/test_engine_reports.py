"""What engines say about themselves, against the real simulator: vLLM's sleep mode.

Both are real child processes on loopback. The simulator answers ``/is_sleeping`` and logs
vLLM's sleep and wake lines; its GPUs come from the simulated libnvidia-ml.so.1 through the
real pynvml binding (no GPU here), so the wake's GPU memory climb is seen as on a real host.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal

import pytest

from exporter_tooling.fakenvml import build_simulated_nvml
from tests.integration.harness import exporter, simulator, target_toml

pytestmark = pytest.mark.integration
INTERVAL = 0.25


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory):
    return build_simulated_nvml(tmp_path_factory.mktemp("nvml")).parent


def _count(metrics: str, family: str) -> float:
    found = re.search(rf'{family}_count\{{target="llm"\}} (\S+)', metrics)
    assert found, f"{family} missing"
    return float(found.group(1))


def test_a_vllm_put_to_sleep_and_woken_is_a_wake_not_a_cold_start(tmp_path, nvml_dir):
    with (
        simulator(
            tmp_path,
            engine="vllm",
            scenario="sleep-wake",
            gpus=1,
            extra=["--flap-seconds", "2.5"],
        ) as sim,
        exporter(
            tmp_path,
            target_toml("llm", sim, engine="vllm", completion=False),
            interval=INTERVAL,
            env={"SIMULATED_NVML_STATE": str(sim.gpu_state)},
            extra_exporter=f'nvml_library_dir = "{nvml_dir}"',
        ) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "ready", "llm", timeout=60)
        asleep = exp.wait_for(lambda t: t["phase"] == "sleeping", "llm", timeout=30)
        assert not asleep["stalled"] and asleep["failure_reason"] is None
        metrics = exp.metrics()
        assert 'inference_server_phase{phase="sleeping",target="llm"} 1.0' in metrics
        assert 'inference_server_phase{phase="degraded",target="llm"} 0.0' in metrics
        awake = exp.wait_for(lambda t: t["last_wake"] is not None, "llm", timeout=30)
        assert awake["phase"] == "ready"
        # The wake took the simulator's ~1.6 s climb, give or take the ticks around it.
        assert 0.5 <= awake["last_wake"]["duration_seconds"] <= 5.0
        froms = [(x["from"], x["to"]) for x in awake["transitions"]]
        assert ("ready", "sleeping") in froms and ("sleeping", "ready") in froms
        metrics = exp.metrics()
        assert _count(metrics, "inference_server_wake_duration_seconds") >= 1
        assert _count(metrics, "inference_server_cold_start_duration_seconds") == 1
        assert 'inference_server_restarts_total{target="llm"} 0.0' in metrics


# --- downloads before loading ----------------------------------------------------------------


def _download_target(sim, stall: str = "") -> str:
    return target_toml("dl", sim, completion=False, stall=stall)


def test_a_start_that_downloads_first_reads_downloading_with_a_rate_and_is_not_stalled(tmp_path):
    with (
        simulator(tmp_path, scenario="download", weights_mb=24, read_mbps=4.0, gpus=1) as sim,
        exporter(tmp_path, _download_target(sim, 'downloading = "2s"'), interval=INTERVAL) as exp,
    ):
        seen = exp.wait_for(
            lambda t: t["phase"] == "downloading" and t["download_bytes"] >= 4 * 2**20, "dl"
        )
        assert seen["download_bytes_per_second"] and seen["download_bytes_per_second"] > 2**20
        assert not seen["stalled"]  # bytes keep arriving: 6 s of download, a 2 s threshold
        ready = exp.wait_for(lambda t: t["phase"] == "ready", "dl", timeout=60)
        assert ready["download_bytes"] >= 20 * 2**20
        assert not any(x["to"] == "failed" for x in ready["transitions"])
        phases = ready["last_cold_start"]["phase_seconds"]
        assert phases["downloading"] >= 3.0 and phases["loading"] > 0  # kept apart


def test_a_download_that_stops_is_flagged_stalled_after_the_threshold(tmp_path):
    with (
        simulator(tmp_path, scenario="hang-downloading", weights_mb=16, read_mbps=8.0) as sim,
        exporter(tmp_path, _download_target(sim, 'downloading = "2s"'), interval=INTERVAL) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "downloading", "dl")
        stalled = exp.wait_for(lambda t: t["stalled"], "dl", timeout=20)
        assert stalled["phase"] == "downloading"
        assert stalled["seconds_since_progress"] >= 2.0


# --- the previous instance's leftovers -------------------------------------------------------


def _leftover_pids(sim) -> list[int]:
    text = sim.gpu_state.read_text() if sim.gpu_state.exists() else ""
    return [int(ln.split()[2]) for ln in text.splitlines() if ln.startswith("proc ")]


def test_workers_left_by_a_crashed_start_are_its_orphans_not_foreign(tmp_path, nvml_dir):
    with (
        simulator(
            tmp_path,
            scenario="orphaned-workers",
            weights_mb=32,
            read_mbps=8.0,
            gpus=2,
            extra=["--flap-seconds", "2"],
        ) as sim,
        exporter(
            tmp_path,
            target_toml("crashy", sim, completion=False),
            interval=INTERVAL,
            env={"SIMULATED_NVML_STATE": str(sim.gpu_state)},
            extra_exporter=f'nvml_library_dir = "{nvml_dir}"',
        ) as exp,
    ):
        try:
            failed = exp.wait_for(lambda t: t["phase"] == "failed", "crashy", timeout=60)
            assert failed["failure_reason"] == "crash"
            left = exp.wait_for(lambda t: t["orphaned_gpu_memory_bytes"], "crashy", timeout=10)
            assert set(left["orphaned_gpu_memory_bytes"]) == {"0", "1"}  # both ranks stayed
            metrics = exp.metrics()
            assert re.search(
                r'inference_server_orphaned_gpu_memory_bytes\{gpu="0",target="crashy"\} [1-9]',
                metrics,
            )
            assert "inference_gpu_foreign_memory_used_bytes{" not in metrics  # not foreign
            # The leftovers end (8 s later): the memory is freed and the orphans are gone.
            exp.wait_for(lambda t: not t["orphaned_gpu_memory_bytes"], "crashy", timeout=20)
        finally:
            for pid in _leftover_pids(sim):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
