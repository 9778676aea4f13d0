"""The benchmark at tiny sizes: every section runs against real processes and reports figures.

The figures of a ``--quick`` run mean little (seconds of measurement on a shared box), so only
their presence and plausibility are checked here; the goals are judged by the full run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter_tooling.bench import profiling
from exporter_tooling.bench.goals import evaluate_goals
from exporter_tooling.bench.profiling import COMPONENTS, OUTSIDE, PACKAGE, component_shares
from exporter_tooling.bench.scrape_client import percentile
from exporter_tooling.bench.servers import Server
from exporter_tooling.bench.sizes import QUICK

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_quick_run_measures_every_section_and_writes_the_report(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "exporter_tooling", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())

    ours = report["scrape"]["exporter"]
    assert ours["sequential"]["count"] == QUICK.scrapes and ours["sequential"]["errors"] == 0
    assert 0 < ours["sequential"]["p50_ms"] <= ours["sequential"]["p99_ms"]
    assert ours["concurrent"]["count"] > 0 and ours["concurrent"]["scrapers"] == 8
    assert ours["memory"]["rss_after_scrapes_mib"] > 10
    node = report["scrape"]["node_exporter"]  # CI installs prometheus-node-exporter
    assert node["sequential"]["count"] == QUICK.node_scrapes, node
    assert report["scrape"]["node_over_exporter_p50"] > 0
    where = ours["memory"]["where_rss_goes"]  # what a missed RSS goal would need
    parts = where["interpreter_mib"] + sum(where["imports_mib"].values()) + where["rest_mib"]
    assert parts == pytest.approx(where["rss_mib"], abs=0.5)
    assert where["imports_mib"]["ours"] > 1 and where["imports_mib"]["prometheus_client"] > 1
    assert where["threads"] >= 2 and "where the RSS goes" in done.stdout

    curve = report["sampling"]["curve"]
    assert [p["targets"] for p in curve] == [1, 2]
    assert all(p["processes"] == p["targets"] * (QUICK.procs_per_target + 1) for p in curve)
    assert all(p["cpu_per_tick_ms"] >= 0 and p["tick_wall_ms"] > 0 for p in curve)
    shares = curve[-1]["where_cpu_goes"]  # the node-sized point says where its CPU goes
    assert sum(shares.values()) == pytest.approx(100, abs=1), shares
    assert set(shares) <= {name for _, name in COMPONENTS} | {OUTSIDE}
    assert f"where the CPU goes at {QUICK.node_targets} targets" in done.stdout

    (ready,) = report["ready"]["runs"]
    assert len(ready["lags_s"]) == QUICK.starts
    assert all(-0.05 < lag < 5 for lag in ready["lags_s"])  # generous: a loaded CI box
    (stall,) = report["stall"]["runs"]
    assert 0 < stall["max_s"] < stall["threshold_s"] + 10

    names = {g["name"] for g in report["goals"]}
    assert {"scrape p99, sequential", "slowest scrape, concurrent scrapers"} <= names
    assert all(g["met"] in (True, False) for g in report["goals"])  # every goal was measured
    assert "node_exporter" in done.stdout and "met" in done.stdout


def test_an_unknown_section_is_a_usage_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "exporter_tooling", "bench", "--only", "scrape,warp", "--out", "x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "unknown section 'warp'" in done.stdout + done.stderr
    assert not (tmp_path / "x").exists()


def test_goals_say_which_are_missed_and_by_what():
    report = {
        "scrape": {
            "exporter": {
                "sequential": {"p99_ms": 2.5},
                "concurrent": {"max_ms": 40.0},
                "memory": {"rss_max_mib": 39.0, "rss_growth_after_warmup_mib": 0.1},
            },
            "node_over_exporter_p50": 20.0,
        },
        "ready": {"runs": [{"interval_s": 1.0, "median_s": 0.5, "max_s": 1.2}]},
    }
    goals = {g["name"]: g for g in evaluate_goals(report, QUICK)}

    assert goals["scrape p99, sequential"]["met"] is False
    assert goals["scrape p99, sequential"]["measured"] == 2.5
    assert goals["node_exporter p50 / ours (times faster)"]["met"] is True
    assert goals["RSS after the scrapes"]["met"] is True
    assert goals["ready lag median, interval 1s"]["met"] is True
    assert goals["ready lag max, interval 1s"]["met"] is False
    sampling = next(g for name, g in goals.items() if name.startswith("sampling CPU"))
    assert sampling["met"] is None  # not measured: neither met nor missed


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_cpu_shares_go_to_our_code_that_called_the_library():
    probe, tree = f"{PACKAGE}sources/probe/prober.py", f"{PACKAGE}sources/process/tree.py"
    frames = [
        {"name": "run", "file": f"{PACKAGE}daemon.py"},
        {"name": "probe_health", "file": probe},
        {"name": "send", "file": "/venv/lib/python3.11/site-packages/h11/_connection.py"},
        {"name": "sample", "file": tree},
        {"name": "_bootstrap", "file": "/usr/lib/python3.11/threading.py"},
    ]
    doc = {
        "shared": {"frames": frames},
        "profiles": [
            # Root first, leaf last: h11 under the probe counts for the probe.
            {"samples": [[0, 1, 2], [0, 1], [0, 3], [4]], "weights": [3, 1, 2, 2]},
        ],
    }
    assert component_shares(doc) == {
        "probes (HTTP)": 50.0,
        "process trees": 25.0,
        OUTSIDE: 25.0,
    }
    assert isinstance(component_shares({"shared": {"frames": []}, "profiles": []}), str)


def test_the_probe_client_comparison_measures_both_clients(capsys):
    from exporter_tooling.bench import probe_clients

    assert probe_clients.main(["--targets", "2", "--probes", "20"]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    for client in probe_clients.CLIENTS:
        row = figures["2"][client]
        assert row["ok"] == row["probes"] > 0
        assert row["cpu_ms_per_probe"] > 0


def test_a_profiler_that_never_finishes_is_reported_not_raised(tmp_path, monkeypatch):
    # A stand-in for a hung py-spy (it hung once on a loaded VM and cost a whole `make bench`
    # its report): a real hang cannot be had on demand, so a script on PATH sleeps instead.
    hung = tmp_path / "py-spy"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(profiling, "SPY_GRACE_SECONDS", 0.5)
    target = subprocess.Popen(["sleep", "30"])
    try:
        server = Server(popen=target, port=0, name="exporter", stderr=tmp_path / "stderr")
        said = profiling.where_cpu_goes(server, 0.5)
    finally:
        target.kill()
        target.wait()
    assert isinstance(said, str) and "did not finish within 1 s" in said
