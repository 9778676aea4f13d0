"""``wait TARGET`` right after a restart: never a verdict about the process that was replaced.

Real parts: an exporter process watching a simulator; the restart stops the simulator and starts
a new one on the same port, pid file and log, as ``systemctl restart`` would.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from exporter.commands.verdict import EXIT_REACHED, Verdict
from exporter.commands.wait import OLD_VERDICT_SNAPSHOTS, Recency, _moment
from exporter.render.status_doc import StatusDoc, TargetDoc, parse_status_doc
from exporter_tooling.simulate.launcher import SimulatorSpec, simulator_argv
from tests.integration.harness import (
    ROOT,
    Exporter,
    Simulator,
    exporter,
    simulator,
    stop,
    target_toml,
)

T0 = 1_700_000_000.0
WAIT = [sys.executable, "-m", "exporter", "wait", "--interval", "0.2"]


def wait(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run the real ``wait`` to completion."""
    return subprocess.run([*WAIT, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def health(sim: Simulator) -> int | None:
    """The simulator's health status code now; None when it refuses connections."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sim.port}/health", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return None


def restart(sim: Simulator, spec: SimulatorSpec) -> None:
    """Stop the simulator (if still running) and start ``spec`` in its place, same files."""
    if sim.proc is not None:
        stop(sim.proc)
        if sim.proc.stdout:
            sim.proc.stdout.close()
    sim.command = simulator_argv(spec, sim.files)
    sim.launch()


def just_after_a_tick(exp: Exporter, interval: str = "8s") -> None:
    """Slow the exporter's ticks (SIGHUP) and return right after one: the snapshot it serves
    now stays the same for ``interval``, as one taken just before a restart would."""
    config = exp.stderr_path.parent / f"config-{exp.port}.toml"
    text = config.read_text()
    config.write_text(text.replace('interval = "0.25s"', f'interval = "{interval}"', 1))
    exp.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "config reloaded" not in exp.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    first = exp.status()["taken_at"]
    while exp.status()["taken_at"] == first and time.monotonic() < deadline:
        time.sleep(0.02)
    assert time.monotonic() < deadline, exp.log_text()


# --- the rule, on hand-built documents ------------------------------------------------------


def status(taken_at: float, **target: object) -> tuple[StatusDoc, TargetDoc]:
    doc = parse_status_doc(
        {
            "ready": True,
            "taken_at": taken_at,
            "sampled_at": taken_at - 0.1,
            "targets": [{"target": "svc", "phase": "ready", **target}],
        }
    )
    return doc, doc["targets"][0]


READY = Verdict(EXIT_REACHED, "svc is ready")
FAILED = Verdict(1, "svc failed")


def test_a_snapshot_sampled_before_the_wait_never_decides():
    recency = Recency(asked_at=T0, started_after=None)
    doc, target = status(T0 - 0.05, started_at=T0 - 1)  # sampled at T0 - 0.15
    assert recency.withheld(doc, target, READY) == "its snapshot is from before this wait"


def test_a_new_process_is_judged_at_once_an_old_failure_only_once_it_holds():
    recency = Recency(asked_at=T0, started_after=None)
    doc, target = status(T0 + 1, started_at=T0 - 3, phase="failed")  # restarted just before
    assert recency.withheld(doc, target, FAILED) is None
    old = Recency(asked_at=T0, started_after=None)
    for n in range(1, OLD_VERDICT_SNAPSHOTS + 1):
        doc, target = status(T0 + n, started_at=T0 - 3600, phase="failed")
        why = old.withheld(doc, target, FAILED)
    assert why is None
    assert Recency(T0, None).withheld(doc, target, FAILED) is not None  # one snapshot: no


def test_an_old_process_is_ready_once_a_probe_after_the_wait_answered_ok():
    probe = {"outcome": "ok", "status_code": 200, "duration_seconds": 0.01, "loading": False}
    recency = Recency(asked_at=T0, started_after=None)
    before = {"health": {**probe, "at": T0 - 1}, "completion": None}
    doc, target = status(T0 + 1, started_at=T0 - 3600, probes=before)
    assert recency.withheld(doc, target, READY) is not None
    after = {"health": {**probe, "at": T0 + 0.5}, "completion": None}
    doc, target = status(T0 + 1, started_at=T0 - 3600, probes=after)
    assert recency.withheld(doc, target, READY) is None


def test_started_after_accepts_only_later_processes():
    recency = Recency(asked_at=T0, started_after=T0 - 60)
    for n in range(1, 5):
        doc, target = status(T0 + n, started_at=T0 - 120)
        assert recency.withheld(doc, target, READY) == (
            "its process started before --started-after"
        )
    doc, target = status(T0 + 9, started_at=T0 - 59.5)
    assert recency.withheld(doc, target, READY) is None


def test_started_after_reads_unix_seconds_and_iso_8601():
    assert _moment("1700000000.5") == 1_700_000_000.5
    assert _moment("2023-11-14T22:13:20Z") == T0
    assert _moment("2023-11-14T23:13:20+01:00") == T0
    with pytest.raises(argparse.ArgumentTypeError, match="not Unix seconds or an ISO-8601"):
        _moment("yesterday")


def test_a_bad_started_after_is_a_usage_error():
    done = wait("svc", "--started-after", "soon", timeout=60)
    assert done.returncode == 2
    assert "--started-after" in done.stderr and "not Unix seconds" in done.stderr


# --- restart, then wait ---------------------------------------------------------------------


@pytest.mark.integration
def test_wait_right_after_a_restart_ends_when_the_new_process_is_ready(tmp_path):
    with (
        simulator(tmp_path, gpus=1) as sim,
        exporter(tmp_path, target_toml("svc", sim)) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] in ("ready", "serving"), "svc")
        # Already up and nobody restarts it: the wait ends at once, not at its timeout.
        done = wait("svc", "--url", exp.url, "--timeout", "30s")
        assert done.returncode == 0, done.stdout + done.stderr
        # --started-after now: that process is too old to count.
        done = wait("svc", "--url", exp.url, "--timeout", "2s", "--started-after", str(time.time()))
        assert done.returncode == 124, done.stdout + done.stderr

        just_after_a_tick(exp)
        restart(sim, SimulatorSpec(port=sim.port, gpus=1, start_seconds=2.0))
        done = wait("svc", "--url", exp.url, "--timeout", "60s")
        assert done.returncode == 0, done.stdout + done.stderr
        assert health(sim) == 200, done.stdout  # "ready" meant the new process answers
        assert "not trusted yet" in done.stdout


@pytest.mark.integration
def test_wait_right_after_restarting_a_failed_server_follows_the_new_process(tmp_path):
    with simulator(tmp_path, gpus=1, scenario="crash-loading") as sim:
        assert sim.proc is not None
        with exporter(tmp_path, target_toml("svc", sim)) as exp:
            exp.wait_for(lambda t: t["phase"] == "failed", "svc")
            with contextlib.suppress(subprocess.TimeoutExpired):
                sim.proc.wait(timeout=10)
            just_after_a_tick(exp)
            spec = SimulatorSpec(port=sim.port, gpus=1, start_seconds=2.0)
            restart(sim, replace(spec, scenario="healthy"))
            done = wait("svc", "--url", exp.url, "--timeout", "60s")
            assert done.returncode == 0, done.stdout + done.stderr
            assert health(sim) == 200, done.stdout
            assert "svc failed: not trusted yet" in done.stdout
