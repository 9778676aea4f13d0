"""The README's `make demo`: the demo command runs a cold start end to end with simulated GPUs."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.integration.harness import ROOT, free_port, stop

pytestmark = pytest.mark.integration
FAST = [
    "--weights-mb",
    "24",
    "--read-mbps",
    "12",
    "--start-seconds",
    "1",
    "--init-seconds",
    "2",
    "--interval",
    "0.25",
]


def get(url):
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.read().decode()


@contextlib.contextmanager
def demo(*args, stderr=subprocess.DEVNULL):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter_tooling",
            "demo",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            *FAST,
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop(proc)
        if proc.stdout:
            proc.stdout.close()


def poll(url, predicate, timeout=60.0):
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, ConnectionError, IndexError):
            last = json.loads(get(url + "/status"))["targets"][0]
            if predicate(last):
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out; last: {last}")


def test_demo_goes_through_every_phase_and_counts_one_cold_start_with_gpus():
    with demo() as (url, proc):
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "simulated sglang engine (healthy)" in banner
        seen = set()
        deadline = time.monotonic() + 60
        while "serving" not in seen and time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, ConnectionError):
                metrics = get(url + "/metrics")
                seen |= set(
                    re.findall(
                        r'inference_server_phase\{phase="(\w+)",target="demo"\} 1\.0', metrics
                    )
                )
            time.sleep(0.1)
        assert {"starting", "loading", "initializing", "serving"} <= seen
        metrics = get(url + "/metrics")
        assert 'inference_server_cold_start_duration_seconds_count{target="demo"} 1.0' in metrics
        gpus = re.findall(
            r'inference_gpu_memory_used_bytes\{gpu="(\d)",uuid="[^"]+"\} (\S+)', metrics
        )
        assert len(gpus) == 2 and all(float(v) > 0 for _, v in gpus)
        assert 'inference_server_gpu_memory_used_bytes{gpu="0",target="demo"}' in metrics


def test_demo_sleep_wake_on_the_default_engine_sleeps_and_its_log_is_never_down(tmp_path):
    # Issue 30 #18: the default engine (sglang) has no sleep mode, so the demo never slept;
    # and the first tick, before the engine had written its log, logged the log source down.
    log = tmp_path / "demo.log"
    with log.open("w") as err, demo("--scenario", "sleep-wake", stderr=err) as (url, proc):
        assert proc.stdout is not None
        assert "simulated vllm engine (sleep-wake)" in proc.stdout.readline()
        poll(url, lambda t: t["phase"] == "sleeping", timeout=90)
    assert "source down source=logs" not in log.read_text(), log.read_text()


def test_demo_refuses_a_scenario_its_engine_cannot_play():
    done = subprocess.run(
        [sys.executable, "-m", "exporter_tooling", "demo", "--scenario", "sleep-wake"]
        + ["--engine", "sglang"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == "demo: --scenario sleep-wake needs an engine with a sleep mode: vllm\n"


def test_demo_oom_scenario_fails_and_shows_the_engine_line_in_status():
    with demo("--scenario", "oom-initializing") as (url, _):
        doc = poll(url, lambda t: t["phase"] == "failed")
        assert doc["failure_reason"] == "oom"
        assert any("out of memory" in line["text"] for line in doc["notable_lines"])


def test_demo_on_simulated_amd_gpus_shows_vram_per_gpu_and_per_target():
    # The AMD GPUs are a simulated libamd_smi.so behind the real amdsmi binding (no AMD GPU
    # here); the engine's workers hold VRAM through the same state file the NVML demo uses.
    with demo("--gpu-vendor", "amd") as (url, _):
        deadline, metrics = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, ConnectionError):
                metrics = get(url + "/metrics")
                if re.search(
                    r'inference_server_gpu_memory_used_bytes\{gpu="1",target="demo"\} [1-9]',
                    metrics,
                ):
                    break
            time.sleep(0.1)
        vendors = re.findall(
            r'inference_gpu_info\{gpu="(\d)",name="([^"]+)",[^}]*vendor="(\w+)"\}', metrics
        )
        assert vendors == [("0", "AMD-Instinct-MI300X", "amd"), ("1", "AMD-Instinct-MI300X", "amd")]
        per_gpu = re.findall(
            r'inference_gpu_memory_used_bytes\{gpu="(\d)",uuid="[^"]+"\} (\S+)', metrics
        )
        assert len(per_gpu) == 2 and all(float(v) > 0 for _, v in per_gpu)
        per_target = re.findall(
            r'inference_server_gpu_memory_used_bytes\{gpu="(\d)",target="demo"\} (\S+)', metrics
        )
        assert [g for g, _ in per_target] == ["0", "1"] and all(float(v) > 0 for _, v in per_target)
        assert 'inference_exporter_source_up{source="amdsmi",target=""} 1.0' in metrics
        assert 'source="nvml"' not in metrics
