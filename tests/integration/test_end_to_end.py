"""The real exporter process watching the real simulator process through whole cold starts.

Both are child processes on loopback; the simulator reads a real weight file, writes a real
log file and answers real HTTP. GPUs come from the simulated libnvidia-ml.so.1 (no GPU here)
through the real pynvml binding in the exporter's NVML child.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.integration.harness import exporter, simulated_nvml, simulator, target_toml

pytestmark = pytest.mark.integration
INTERVAL = 0.25
ORDER = ["down", "starting", "loading", "initializing", "ready", "serving"]


def phases_seen(doc):
    seen = [t["from"] for t in doc["transitions"]] + [doc["phase"]]
    return [p for i, p in enumerate(seen) if i == 0 or p != seen[i - 1]]


def test_healthy_cold_start_through_every_phase_with_gpus(tmp_path, nvml_dir):
    with (
        simulator(tmp_path, init_seconds=2.0, launch=False) as sim,
        exporter(
            tmp_path,
            target_toml("demo", sim),
            interval=INTERVAL,
            **simulated_nvml(sim.gpu_state, nvml_dir),
        ) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "down", "demo")
        sim.launch()  # watched from "down": every phase of the start is seen
        loading = exp.wait_for(lambda t: t["phase"] == "loading", "demo")
        assert loading["process"]["processes"] >= 2  # main + a worker, as real engines do
        doc = exp.wait_for(lambda t: t["phase"] == "serving", "demo")
        seen = phases_seen(doc)
        assert seen == [p for p in ORDER if p in seen]
        assert {"starting", "loading", "initializing", "ready", "serving"} <= set(seen)
        assert not doc["stalled"]
        # the weight file was read by the worker: visible in the tree's read_bytes
        assert doc["process"]["read_bytes"] >= 16 * 2**20
        metrics = exp.metrics()
        assert 'inference_server_cold_start_duration_seconds_count{target="demo"} 1.0' in metrics
        assert 'inference_server_phase{phase="serving",target="demo"} 1.0' in metrics
        # simulated GPU memory attributed to the simulator's workers
        used = re.findall(
            r'inference_server_gpu_memory_used_bytes\{gpu="\d",target="demo"\} '
            r"(\S+)",
            metrics,
        )
        assert used and all(float(v) > 0 for v in used)
        assert 'inference_exporter_source_up{source="nvml",target=""} 1.0' in metrics


def test_killing_the_engine_during_loading_is_failed_within_two_intervals(tmp_path):
    with (
        simulator(tmp_path, weights_mb=64, read_mbps=8.0) as sim,
        exporter(tmp_path, target_toml("victim", sim), interval=INTERVAL) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "loading", "victim")
        os.killpg(os.getpgid(sim.proc.pid), 0)  # still alive
        killed_at = time.time()
        sim.proc.send_signal(signal.SIGKILL)
        doc = exp.wait_for(lambda t: t["phase"] == "failed", "victim", timeout=10)
        failed_at = doc["since"]
        assert failed_at - killed_at <= 2 * INTERVAL + 0.5  # two intervals, plus scheduling
        assert doc["failure_reason"] == "exited"
        # the exporter keeps serving
        assert (
            'inference_server_start_failures_total{reason="exited",target="victim"} 1.0'
            in exp.metrics()
        )


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("crash-loading", "crash"),
        ("oom-initializing", "oom"),
    ],
)
def test_failing_starts_end_failed_with_the_right_reason(tmp_path, scenario, reason):
    with (
        simulator(tmp_path, scenario=scenario) as sim,
        exporter(tmp_path, target_toml("t", sim), interval=INTERVAL) as exp,
    ):
        doc = exp.wait_for(lambda t: t["phase"] == "failed", "t", timeout=30)
        assert doc["failure_reason"] == reason
        assert doc["notable_lines"], "the fatal line is kept for /status and wait"


@pytest.mark.parametrize("scenario", ["hang-loading", "hang-initializing"])
def test_hangs_raise_the_stall_flag_within_threshold_plus_two_intervals(tmp_path, scenario):
    stall = 'starting = "4s"\nloading = "2s"\ninitializing = "2s"'
    with (
        simulator(tmp_path, scenario=scenario, weights_mb=32, read_mbps=16) as sim,
        exporter(tmp_path, target_toml("h", sim, stall=stall), interval=INTERVAL) as exp,
    ):
        doc = exp.wait_for(lambda t: t["stalled"], "h", timeout=40)
        quiet_for = doc["stall_reason"]
        assert doc["phase"] in ("loading", "initializing")
        assert doc["last_progress_at"] is not None
        # the flag went up no later than threshold + two intervals after the last evidence
        stalled_after = time.time() - doc["last_progress_at"]
        assert stalled_after <= 2.0 + 2 * INTERVAL + 1.0, quiet_for
        assert 'inference_server_stalled{target="h"} 1.0' in exp.metrics()


def test_slow_load_never_stalls(tmp_path):
    stall = 'starting = "4s"\nloading = "2s"\ninitializing = "3s"'
    with (
        simulator(tmp_path, scenario="slow", weights_mb=16, read_mbps=4) as sim,
        exporter(tmp_path, target_toml("s", sim, stall=stall), interval=INTERVAL) as exp,
    ):
        seen_stall = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            doc = exp.target("s")
            seen_stall |= doc["stalled"]
            if doc["phase"] in ("ready", "serving"):
                break
            time.sleep(0.1)
        assert doc["phase"] in ("ready", "serving")
        assert not seen_stall


def test_flapping_health_after_ready_becomes_degraded(tmp_path):
    with (
        simulator(tmp_path, scenario="flap", extra=["--flap-seconds", "2"]) as sim,
        exporter(tmp_path, target_toml("f", sim), interval=INTERVAL) as exp,
    ):
        exp.wait_for(lambda t: t["ready"], "f")
        exp.wait_for(lambda t: t["phase"] == "degraded", "f", timeout=20)
        exp.wait_for(lambda t: t["ready"], "f", timeout=20)


def test_ready_is_noticed_within_one_interval_of_the_engine(tmp_path):
    with (
        simulator(tmp_path) as sim,
        exporter(tmp_path, target_toml("r", sim, completion=False), interval=INTERVAL) as exp,
    ):
        ready_at = sim.ready_at()
        doc = exp.wait_for(lambda t: t["ready"], "r")
        lag = doc["since"] - ready_at
        # one interval plus the probe's own time; a loaded CI box gets half a second more
        assert -0.05 <= lag <= INTERVAL + 0.5, lag


def test_exporter_restart_mid_load_keeps_start_time_phase_and_history(tmp_path):
    state = tmp_path / "state"
    # 12 s of loading: the restart (one exporter's stop, the next one's start) must fall
    # inside it; 6 s was once not enough on a loaded box and the second exporter saw "ready".
    with simulator(tmp_path, weights_mb=48, read_mbps=4, init_seconds=1.0) as sim:
        toml = target_toml("k", sim)
        with exporter(tmp_path, toml, interval=INTERVAL, state=state) as exp:
            first = exp.wait_for(lambda t: t["phase"] == "loading", "k")
        with exporter(tmp_path, toml, interval=INTERVAL, state=state) as exp:
            again = exp.target("k")
            assert again["started_at"] == first["started_at"]
            assert again["phase"] in ("loading", "initializing")  # not "starting" again
            done = exp.wait_for(lambda t: t["phase"] == "serving", "k")
            cold = done["last_cold_start"]
            assert cold["outcome"] == "ready"
            # measured from the process start, across the exporter restart
            assert cold["started_at"] == pytest.approx(first["started_at"], abs=0.02)
            assert cold["duration_seconds"] >= done["since"] - first["started_at"] - 2
        # the finished start is in the sqlite history a third exporter reads
        from exporter.history import History

        store = History.open(str(state))
        try:
            starts = store.starts("k")
        finally:
            store.close()
        assert [s.outcome for s in starts] == ["ready"]


def test_xid_79_during_loading_fails_the_start_with_gpu_error(tmp_path, nvml_dir):
    """The simulated GPU 0 reports Xid 79 at 40% of the weights (through the fake NVML's
    event API and the real pynvml binding); the load then hangs, as a real one does."""
    with (
        simulator(tmp_path, scenario="xid-loading", gpus=2) as sim,
        exporter(
            tmp_path,
            target_toml("t", sim),
            interval=INTERVAL,
            **simulated_nvml(sim.gpu_state, nvml_dir),
        ) as exp,
    ):
        doc = exp.wait_for(lambda t: t["phase"] == "failed", "t", timeout=30)
        assert doc["failure_reason"] == "gpu_error"
        assert doc["reason_detail"] == "Xid 79 on GPU 0 (GPU has fallen off the bus)"
        metrics = exp.metrics()
        assert re.search(
            r'inference_gpu_xid_errors_total\{gpu="0",uuid="GPU-[^"]+",xid="79"\} 1\.0', metrics
        )
        assert 'inference_gpu_xid_errors_total{gpu="1"' not in metrics
        assert 'inference_server_start_failures_total{reason="gpu_error",target="t"} 1.0' in metrics
        health = [g["health"] for g in exp.status()["gpus"]]
        assert [h["xid_errors"] for h in health] == [{"79": 1}, {}]
        assert health[0]["pcie_link"] == "Gen5 x16 (max Gen5 x16)"


@pytest.mark.parametrize("last_words", [None, "oom"])
def test_killing_a_serving_engine_counts_a_death_and_leaves_no_stale_reading(tmp_path, last_words):
    # Issue 30 #2: a SIGKILL while serving went down with no counter or alert, progress 100 %,
    # probe_success{probe="completion"} 1 and the process's age ticking on; an OOM line
    # printed just before was counted but the reason said "process exited".
    with (
        simulator(tmp_path) as sim,
        exporter(tmp_path, target_toml("victim", sim), interval=INTERVAL) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "serving", "victim", timeout=60)
        assert 'probe="completion",target="victim"} 1.0' in exp.metrics()
        if last_words == "oom":
            with sim.log_file.open("a") as log:  # the engine's last line, as sglang-03 prints it
                log.write(
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB.\n"
                )
            exp.wait_for(lambda t: "out of memory" in str(t["notable_lines"]), "victim")
        sim.proc.send_signal(signal.SIGKILL)
        doc = exp.wait_for(lambda t: t["phase"] == "down", "victim", timeout=10)
        metrics = exp.metrics()
        reason = last_words or "exited"
        assert f'inference_server_deaths_total{{reason="{reason}",target="victim"}} 1.0' in metrics
        assert 'probe="completion",target="victim"}' not in metrics
        assert 'inference_server_load_progress_ratio{target="victim"}' not in metrics
        assert doc["progress_ratio"] is None and doc["elapsed_seconds"] is None
        assert doc["since"] is not None, "when it went down"
        if last_words:
            assert doc["reason"] == "process exited after a fatal log line: oom"
            assert "CUDA out of memory" in (doc["reason_detail"] or "")
        else:
            assert doc["reason"] == "process exited"
        assert 'inference_server_start_failures_total{reason="exited",target="victim"} 0.0' in (
            metrics
        ), "a death after ready is no failed start"
