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
import subprocess
import sys
import time
import urllib.error

import pytest

from exporter_tooling.simulate.plan import SimEngine, weight_layout
from tests.httpservers import LoopbackServer, reply
from tests.integration.harness import exporter, simulated_nvml, simulator, target_toml

pytestmark = pytest.mark.integration
INTERVAL = 0.25
MIB = 2**20
#: The download scenario's weights and the rate the simulated hub sends them at (6 s).
DOWNLOAD_BYTES = 24 * MIB
DOWNLOAD_MIB_PER_SECOND = 4.0


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
            **simulated_nvml(sim.gpu_state, nvml_dir),
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


def _follow_download(exp, sim) -> tuple[list[tuple[float, float, dict]], float]:
    """Every distinct tick of ``dl`` until it is ready, as (sampled_at, taken_at, target),
    and a time by which every weight file stood complete (renamed from ``.incomplete``)."""
    files = [s.path for s in weight_layout(SimEngine.SGLANG, sim.files.weights, DOWNLOAD_BYTES)]
    seen: list[tuple[float, float, dict]] = []
    done_at = None
    deadline = time.monotonic() + 90
    while not seen or seen[-1][2]["phase"] != "ready":
        assert time.monotonic() < deadline, f"not ready: {seen[-1:]}"
        if done_at is None and all(p.exists() for p in files):
            done_at = time.time()
        with contextlib.suppress(urllib.error.URLError, ConnectionError):
            doc = exp.status()
            if doc.get("taken_at") and (not seen or doc["taken_at"] != seen[-1][1]):
                (dl,) = doc["targets"]
                seen.append((doc["sampled_at"], doc["taken_at"], dl))
        time.sleep(0.05)
    assert done_at is not None
    return seen, done_at


def test_a_start_that_downloads_first_reads_downloading_with_a_rate_and_is_not_stalled(tmp_path):
    with (
        simulator(
            tmp_path,
            scenario="download",
            weights_mb=DOWNLOAD_BYTES // MIB,
            read_mbps=DOWNLOAD_MIB_PER_SECOND,
            gpus=1,
            launch=False,
        ) as sim,
        exporter(tmp_path, _download_target(sim, 'downloading = "2s"'), interval=INTERVAL) as exp,
    ):
        sim.launch()  # once the exporter watches: the whole download is in its ticks
        ticks, done_at = _follow_download(exp, sim)
    docs = [t for _, _, t in ticks]
    seen = next(t for t in docs if t["phase"] == "downloading" and t["download_bytes"] >= 4 * MIB)
    assert seen["download_bytes_per_second"] and seen["download_bytes_per_second"] > MIB
    assert not seen["stalled"]  # bytes keep arriving: 6 s of download, a 2 s threshold
    ready = docs[-1]
    assert not any(x["to"] == "failed" for x in ready["transitions"])
    # What the engine wrote, less what no tick can count: before the first tick that found
    # its tree (the baseline) and after the last one that saw its files open; at most the
    # download's rate over those spans, plus the 1 MiB write in flight at each end.
    total = ready["download_bytes"]
    found = next(taken for _, taken, t in ticks if t["process"])
    downloaded = [t["download_bytes"] for t in docs if t["phase"] == "downloading"][-1]
    last_short = max(sampled for sampled, _, t in ticks if t["download_bytes"] < downloaded)
    unseen = (found - ready["started_at"]) + max(0.0, done_at - last_short)
    unseen_bytes = DOWNLOAD_MIB_PER_SECOND * MIB * unseen + 2 * MIB
    assert DOWNLOAD_BYTES - unseen_bytes <= total <= DOWNLOAD_BYTES + MIB, (total, unseen)
    # Downloading from a tick no later than the first that showed it to one after the last
    # that counted less than the phase's bytes; the load kept apart from it.
    phases = ready["last_cold_start"]["phase_seconds"]
    first = next(taken for _, taken, t in ticks if t["phase"] == "downloading")
    assert phases["downloading"] >= last_short - first and phases["loading"] > 0, phases


def test_a_download_that_stops_is_flagged_stalled_after_the_threshold(tmp_path):
    with (
        simulator(
            tmp_path, scenario="hang-downloading", weights_mb=16, read_mbps=8.0, launch=False
        ) as sim,
        exporter(tmp_path, _download_target(sim, 'downloading = "2s"'), interval=INTERVAL) as exp,
    ):
        # Launched once the exporter watches: a busy machine can take longer to start the
        # exporter than the engine takes to write half its weights and go silent.
        sim.launch()
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
            **simulated_nvml(sim.gpu_state, nvml_dir),
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


# --- engine-reported startup beside the observed one -----------------------------------------


def test_a_simulated_sglang_reports_its_load_time_beside_the_observed_one(tmp_path):
    with (
        simulator(tmp_path, engine="sglang", weights_mb=24, read_mbps=8.0, gpus=1) as sim,
        exporter(tmp_path, target_toml("sg", sim, completion=False), interval=INTERVAL) as exp,
    ):
        doc = exp.wait_for(lambda t: t["engine_report"] is not None, "sg", timeout=60)
        report = doc["engine_report"]
        assert doc["phase"] in ("ready", "serving")
        assert 1.0 < report["load_seconds"] < 10.0  # 24 MiB at 8 MiB/s, as the engine timed it
        assert report["startup_seconds"] > report["load_seconds"]
        assert report["observed_load_seconds"] is not None
        metrics = exp.metrics()
        assert re.search(
            r'inference_server_load_duration_seconds\{source="engine",target="sg"\}', metrics
        )
        assert re.search(
            r'inference_server_load_duration_seconds\{source="observed",target="sg"\}', metrics
        )


@pytest.fixture
def engine_process(tmp_path):
    """A real process standing for the engine whose HTTP side a loopback server plays."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pidfile = tmp_path / "engine.pid"
    pidfile.write_text(f"{child.pid}\n")
    yield pidfile
    child.kill()
    child.wait()


def _loopback_target(name: str, engine: str, url: str, health: str, pidfile) -> str:
    return (
        f'[[target]]\nname = "{name}"\nengine = "{engine}"\nbase_url = "{url}"\n'
        f'health_path = "{health}"\nprobe_timeout = "0.2s"\npidfile = "{pidfile}"\n'
    )


TRITON_MODELS = [
    {"name": "llama", "version": "1", "state": "READY"},
    {
        "name": "mistral",
        "version": "2",
        "state": "UNAVAILABLE",
        "reason": "failed to load 'mistral' version 2: Internal: CUDA out of memory",
    },
]


def test_a_triton_with_two_models_one_failing_reports_the_failing_one_and_why(
    tmp_path, engine_process
):
    """Triton's HTTP side is a real loopback server with Triton's reply shapes (no Triton here)."""
    with LoopbackServer() as triton:
        triton.routes["/v2/health/ready"] = reply(400, b"")
        triton.routes["/v2/repository/index"] = reply(200, TRITON_MODELS)
        toml = _loopback_target("tr", "triton", triton.url, "/v2/health/ready", engine_process)
        with exporter(tmp_path, toml, interval=INTERVAL) as exp:
            failed = exp.wait_for(lambda t: t["phase"] == "failed", "tr", timeout=20)
    assert failed["reason"] == "model mistral failed to load"
    assert "CUDA out of memory" in failed["reason_detail"]
    models = {m["name"]: m for m in failed["engine_report"]["models"]}
    assert models["llama"]["state"] == "READY" and models["mistral"]["state"] == "UNAVAILABLE"


def test_a_trtllm_server_reports_its_load_phases_once_ready(tmp_path, engine_process):
    """trtllm-serve's HTTP side is a real loopback server with its reply shapes."""
    info = {
        "startup_metrics": {
            "model_loader": {
                "total_model_loading_seconds": 41.5,
                "checkpoint_preparation_seconds": 4.0,
                "weight_population_seconds": 35.0,
                "post_load_processing_seconds": 2.5,
            }
        }
    }
    with LoopbackServer() as trt:
        trt.routes["/health"] = reply(200, b"")
        trt.routes["/server_info"] = reply(200, info)
        toml = _loopback_target("trt", "trtllm", trt.url, "/health", engine_process)
        with exporter(tmp_path, toml, interval=INTERVAL) as exp:
            doc = exp.wait_for(lambda t: t["engine_report"] is not None, "trt", timeout=20)
    assert doc["engine_report"]["load_seconds"] == 41.5
    assert doc["engine_report"]["steps"] == {
        "checkpoint_preparation": 4.0,
        "weight_population": 35.0,
        "post_load_processing": 2.5,
    }
