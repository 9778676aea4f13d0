"""A host without GPUs running the shipped config raises no alert and says once what is absent.

The real exporter runs deploy/config.example.toml (only its state directory moved into the
test's folder) on this CPU-only machine: no NVIDIA library, targets that are not running, a
log file not written yet. Its real /metrics becomes the input of a ``promtool test rules`` run
of the shipped deploy/prometheus/alerts.yml: the host's series, unchanged for 20 minutes (the
exporter's own tick timestamp kept fresh), must fire no alert at all; before this change
``source_up{source="nvml"} 0`` fired InferenceExporterSourceDown after 5 minutes.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import ROOT, free_port, stop
from tests.test_rules import alerts, promtool

pytestmark = pytest.mark.integration
INSTANCE = "cpu-host:10049"
MINUTES = 20


def shipped_config(work: Path) -> Path:
    text = (ROOT / "deploy/config.example.toml").read_text()
    lines = [
        f'state_directory = "{work / "state"}"' if ln.startswith("state_directory") else ln
        for ln in text.splitlines()
    ]
    path = work / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_and_scrape(work: Path) -> tuple[str, str]:
    """The exporter's /metrics once every absent source has been seen, and its log."""
    port = free_port()
    log = work / "exporter.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--config.file", str(shipped_config(work))]
            + ["--web.listen-address", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                text = ""
            if 'inference_exporter_source_absent{source="nvml"' in text:
                time.sleep(6)  # a few more ticks: an NVML retry and the log file's next look
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return r.read().decode(), log.read_text()
            time.sleep(0.2)
        raise AssertionError(f"nvml never read as absent:\n{log.read_text()}")
    finally:
        stop(proc)


def series_for_promtool(exposition: str, scraped_at: float) -> list[dict[str, str]]:
    """Every sample as a promtool input series, constant for ``MINUTES`` minutes.

    Timestamps become seconds relative to the test's time 0 (promtool's clock starts there),
    and the loop's own tick timestamp follows the clock, as a running exporter's does.
    """
    series = [{"series": f'up{{job="inference-lifecycle-exporter",instance="{INSTANCE}"}}'}]
    series[0]["values"] = f"1x{MINUTES}"
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            labels = {**s.labels, "job": "inference-lifecycle-exporter", "instance": INSTANCE}
            selector = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
            if s.name == "inference_exporter_last_tick_timestamp_seconds":
                values = f"0+60x{MINUTES}"
            elif s.value != s.value:  # NaN: no alert reads one
                continue
            elif s.name.endswith(("_timestamp_seconds", "_start_time_seconds")):
                values = f"{s.value - scraped_at:.3f}x{MINUTES}"
            else:
                values = f"{s.value!r}x{MINUTES}"
            series.append({"series": f"{s.name}{{{selector}}}", "values": values})
    return series


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this host has an NVIDIA library"
)
def test_a_cpu_only_host_on_the_shipped_config_fires_no_alert(tmp_path):
    exposition, log = run_and_scrape(tmp_path)
    scraped_at = time.time()

    # The absent sources, once each, with the keys that turn them on or off.
    absent = [ln for ln in log.splitlines() if "source absent" in ln]
    assert len([ln for ln in absent if "source=nvml" in ln]) == 1, log
    nvml = next(ln for ln in absent if "source=nvml" in ln)
    assert "nvml = false" in nvml and "nvml_library_dir" in nvml
    assert "source down" not in log and "level=error" not in log, log
    assert 'inference_exporter_source_up{source="nvml"' not in exposition

    test = {
        "rule_files": [str(ROOT / "deploy/prometheus/alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series_for_promtool(exposition, scraped_at),
                "alert_rule_test": [
                    {"eval_time": f"{m}m", "alertname": a["alert"], "exp_alerts": []}
                    for a in alerts()
                    for m in (5, MINUTES)
                ],
            }
        ],
    }
    path = tmp_path / "quiet_host_test.yml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    checked = len(test["tests"][0]["input_series"])
    print(f"absent sources logged: {len(absent)}; series checked: {checked}")
    assert result.returncode == 0, result.stdout + result.stderr
