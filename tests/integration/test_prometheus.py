"""A real Prometheus scraping the real exporter watching two real simulated engines.

Prometheus (Debian package ``prometheus``) runs on loopback with the repository's rules and a
1 s scrape interval. One engine starts cleanly, the other hangs while loading. Through the HTTP
API: every dashboard query parses and returns data, the stall alert fires for the hung target
only, and the cold-start histogram holds the healthy start. The rules are a test copy whose
``for:`` is 1 s, so the alerts fire within the test's minute rather than after theirs.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter_tooling.fakenvml import write_state
from tests.integration.harness import (
    Exporter,
    Simulator,
    exporter,
    simulated_nvml,
    simulator,
    target_toml,
)
from tests.integration.monitoring import Prometheus, prometheus
from tests.test_dashboards import DASHBOARDS, exprs, variable_queries

pytestmark = pytest.mark.integration
INTERVAL = 0.5
GiB = 2**30
STALL = 'starting = "4s"\nloading = "2s"\ninitializing = "2s"'
# What Grafana would put in place of its variables for a 1 s scrape interval.
GRAFANA_VARS = {"$__rate_interval": "4s", "$__range": "1h", "$__interval": "1s"}


@contextmanager
def merged_gpus(state: Path, sims: list[Simulator]) -> Iterator[None]:
    """One simulated NVML state for both engines, plus memory held by a stranger (this pid).

    Each simulator publishes its own GPUs; the exporter reads one file. The healthy engine's
    GPU lines, every engine's process lines, a PCIe rate and a foreign process are merged in.
    """
    done = threading.Event()

    def merge() -> None:
        while not done.wait(0.1):
            gpus, procs = [], []
            for i, sim in enumerate(sims):
                try:
                    lines = sim.gpu_state.read_text().splitlines()
                except FileNotFoundError:
                    continue
                gpus += [ln for ln in lines if ln.startswith("gpu ") and i == 0]
                procs += [ln for ln in lines if ln.startswith("proc ")]
            extra = ["pcie 0 2000000", "pcie 1 2000000", f"proc 1 {os.getpid()} {2 * GiB}"]
            write_state(state, gpus + procs + extra)

    thread = threading.Thread(target=merge, name="merge-gpus")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):  # longest first: no name inside another
        expr = expr.replace(name, variables[name])
    return expr


def targets_toml(healthy: Simulator, hung: Simulator) -> str:
    return target_toml("healthy", healthy, interval=INTERVAL).replace(
        "[[target]]\n", '[[target]]\ndeployment = "chat-prod"\nmodel = "tiny"\n'
    ) + target_toml("hung", hung, stall=STALL, interval=INTERVAL).replace(
        "[[target]]\n", '[[target]]\ndeployment = "batch-prod"\nmodel = "tiny"\n'
    )


def test_dashboards_and_alerts_against_a_real_prometheus(tmp_path, nvml_dir):
    started = time.time()
    gpu_state = tmp_path / "gpus.state"
    with (
        # loads for about 7 s, long enough for a rate-based ETA (the ETA panel needs data)
        simulator(tmp_path, init_seconds=1.0, weights_mb=56, read_mbps=8) as healthy,
        simulator(tmp_path, scenario="hang-loading", weights_mb=32, read_mbps=16) as hung,
        merged_gpus(gpu_state, [healthy, hung]),
        exporter(
            tmp_path,
            targets_toml(healthy, hung),
            interval=INTERVAL,
            **simulated_nvml(gpu_state, nvml_dir),
        ) as exp,
        prometheus(tmp_path, f"127.0.0.1:{exp.port}") as prom,
    ):
        instance = f"127.0.0.1:{exp.port}"
        _wait_for_both_outcomes(exp, prom)
        _assert_stall_alert_fires_for_the_hung_target_only(prom)
        count = prom.query('inference_server_cold_start_duration_seconds_count{target="healthy"}')
        assert [float(s["value"][1]) for s in count] == [1.0]
        ready = prom.query("deployment:inference_server_ready:min")
        assert {s["metric"]["deployment"]: s["value"][1] for s in ready} == {
            "chat-prod": "1",
            "batch-prod": "0",
        }
        _assert_every_dashboard_query_returns_data(prom, instance, started)
    assert time.time() - started < 60


def _wait_for_both_outcomes(exp: Exporter, prom: Prometheus) -> None:
    exp.wait_for(lambda t: t["phase"] == "serving", "healthy", timeout=40)
    exp.wait_for(lambda t: t["stalled"], "hung", timeout=40)
    prom.wait_for('inference_server_phase{target="healthy",phase="serving"} == 1', "serving")
    # recording rules run on their own interval: the first evaluation after serving
    prom.wait_for('deployment:inference_server_ready:min{deployment="chat-prod"} == 1', "rule")
    prom.wait_for(
        'ALERTS{alertname="InferenceColdStartStalled",alertstate="firing"}', "the stall alert"
    )
    # the foreign process shows up after the merge thread's first rounds
    prom.wait_for("inference_gpu_foreign_memory_used_bytes > 0", "foreign GPU memory")


def _assert_stall_alert_fires_for_the_hung_target_only(prom: Prometheus) -> None:
    stalled = prom.query('ALERTS{alertname="InferenceColdStartStalled"}')
    assert {(s["metric"]["target"], s["metric"]["alertstate"]) for s in stalled} == {
        ("hung", "firing")
    }
    assert stalled[0]["metric"]["severity"] == "critical"


def _assert_every_dashboard_query_returns_data(
    prom: Prometheus, instance: str, since: float
) -> None:
    empty = []
    checked = 0
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        instant = {
            t["expr"] for p in doc["panels"] for t in p.get("targets", []) if t.get("instant")
        }
        for expr in exprs(doc) + variable_queries(doc):
            checked += 1
            if not any(
                _has_data(prom, substitute(expr, vars_), expr in instant, since)
                for vars_ in _variable_choices(instance)
            ):
                empty.append(f"{path.name}: {expr}")
    assert checked > 40
    assert empty == []


def _variable_choices(instance: str) -> list[dict[str, str]]:
    """Grafana's picks of one host and one target, for each target in turn."""
    picks = [
        {"$instance": instance, "$target": t, "$deployment": ".*"} for t in ("hung", "healthy")
    ]
    return [{**GRAFANA_VARS, **p} for p in picks]


def _has_data(prom: Prometheus, expr: str, instant: bool, since: float) -> bool:
    assert not re.search(r"\$\w", expr), f"unsubstituted variable in {expr}"
    # Instant panels show "now", but a value such as the ETA exists only during the load:
    # the query must have returned data at some point of the run.
    return bool(prom.query(expr)) or bool(prom.query_range(expr, since))
