"""The probe: OK through a slow start that progresses, failing within a tick of a hang.

Real exporter processes watching real simulated engines, asked at ``/probe`` and through the
real ``probe`` command.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request

import pytest

from tests.commands.test_wait import cli
from tests.integration.harness import exporter, simulator, target_toml

pytestmark = pytest.mark.integration
INTERVAL = 0.25


def ask(url: str, target: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{url}/probe?target={target}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_slow_start_that_progresses_stays_ok_and_advice_follows_history(tmp_path):
    with (
        simulator(tmp_path, scenario="slow", weights_mb=24, read_mbps=6.0, gpus=1) as sim,
        exporter(tmp_path, target_toml("slow", sim, completion=False), interval=INTERVAL) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] != "down", "slow")
        answers = []
        while (doc := exp.target("slow"))["phase"] not in ("ready", "serving", "failed"):
            answers.append(ask(exp.url, "slow"))
            time.sleep(INTERVAL)
        assert doc["phase"] in ("ready", "serving")
        assert len(answers) >= 8 and all(code == 200 for code, _ in answers), answers
        assert any("progressing" in line for _, line in answers)
        advice = exp.wait_for(lambda t: t["startup_probe"] is not None, "slow")["startup_probe"]
        p95 = advice["p95_cold_start_seconds"]
        assert advice["period_seconds"] == 10
        assert advice["failure_threshold"] == math.ceil(1.5 * p95 / 10) + 1
        done = cli("probe", "slow", "--url", exp.url)
        assert done.returncode == 0 and done.stdout.startswith("slow ready"), done


def probe_of_a_stalled_snapshot(exp, target: str) -> tuple[dict, int, str, int]:
    """A stalled snapshot of ``target``, ``/probe``'s answer asked while it was current, and
    how many snapshots before it answered 200 while not stalled.

    The exporter publishes a snapshot a tick; the answer is only judged against the snapshot
    read before and after it. On a busy machine a start can look stalled for a tick and then
    move again (a starved reader catching up): that snapshot's answer is still judged, and
    the wait goes on until one is stalled, so the test holds under load.
    """
    deadline, moving = time.monotonic() + 30, 0
    while time.monotonic() < deadline:
        before = exp.status()
        doc = next(t for t in before["targets"] if t["target"] == target)
        code, line = ask(exp.url, target)
        if exp.status()["taken_at"] == before["taken_at"]:
            assert (code == 503) == doc["stalled"], (doc, code, line)
            if doc["stalled"]:
                return doc, code, line, moving
            moving += 1
        time.sleep(INTERVAL / 5)
    raise AssertionError(f"never stalled: {exp.target(target)}")


def test_a_hang_fails_the_probe_in_the_tick_it_is_flagged_stalled(tmp_path):
    stall = 'starting = "20s"\nloading = "2s"\ninitializing = "20s"'
    with (
        simulator(tmp_path, scenario="hang-loading", weights_mb=32, read_mbps=16, gpus=1) as sim,
        exporter(tmp_path, target_toml("hang", sim, stall=stall), interval=INTERVAL) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "loading", "hang")
        flagged, code, line, moving = probe_of_a_stalled_snapshot(exp, "hang")
        assert moving >= 1, "loading, not stalled yet, answered 200"
        assert code == 503 and line.startswith("hang stalled in loading"), line
        assert flagged["seconds_since_progress"] < 2.0 + 2 * INTERVAL + 1.0
        deadline = time.monotonic() + 30  # the command: a second or two later, still stalled
        while (done := cli("probe", "hang", "--url", exp.url)).returncode == 0:
            assert not exp.target("hang")["stalled"], "exit 0 only while it moves again"
            assert time.monotonic() < deadline, done
        assert done.returncode == 1 and "stalled in loading" in done.stdout, done
        unknown = cli("probe", "nope", "--url", exp.url)
        assert unknown.returncode == 2 and "no target named 'nope'" in unknown.stdout
        assert ask(exp.url, "")[0] in (400, 404)
