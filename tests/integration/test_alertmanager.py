"""The alert reaches a person: the real Alertmanager between the real Prometheus and a pager.

Debian's ``prometheus-alertmanager`` runs deploy/alertmanager/alertmanager.yml with two
test-only changes: its receiver posts to a webhook server in this test, and ``group_interval``
is 5 s instead of 5 m, so the resolved notification and any follow-up of a group come within
the test. The real Prometheus evaluates the shipped deploy/prometheus/alerts.yml, ``for:``
unchanged, every second (Prometheus' default is once a minute, which would add up to a minute
to every time below), scraping every 3 s: on a busy CI machine a scrape of 22 targets took up
to 0.7 s, and one that times out makes every series stale, which restarts each alert's
``for:``. The exporter watches simulated engines and, for the fleet, 20 real processes that
never get past starting:

- a load that hangs (its process tree stopped) reaches the receiver as the stall alert with
  what on-call needs, and as resolved once the load goes on (the tree continued);
- a crash loop arrives as one failed-start notification, however many restarts follow it;
- the crash loop's next attempt stalls while its failure still fires: the stall is inhibited;
- 20 targets of two models going cold at once stall together: one notification per model.

The measured stall-to-notification time (shipped ``for: 1m`` and ``group_wait: 30s``) and the
fleet's notification count are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from exporter_tooling.simulate.launcher import SimulatorSpec, simulator_argv
from tests.integration.harness import (
    ROOT,
    Exporter,
    Simulator,
    exporter,
    free_port,
    simulator,
    stop,
    target_toml,
)
from tests.integration.monitoring import alertmanager, prometheus

pytestmark = pytest.mark.integration
INTERVAL = 0.5
SHIPPED = ROOT / "deploy/alertmanager/alertmanager.yml"
RULES = [ROOT / "deploy/prometheus/alerts.yml", ROOT / "deploy/prometheus/rules.yml"]
STALL = 'starting = "4s"\nloading = "3s"\ninitializing = "3s"'
FLEET = 20
STALLED = "InferenceColdStartStalled"
FAILED = "InferenceStartFailed"


@dataclass
class Receiver:
    """A webhook receiver on loopback: every notification Alertmanager posts, with its time."""

    url: str
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def notifications(self, alertname: str, **labels: str) -> list[tuple[float, dict[str, Any]]]:
        """Notifications of one group (Alertmanager's ``groupLabels``), in arrival order."""
        want = {"alertname": alertname, **labels}
        return [(t, n) for t, n in list(self.received) if n["groupLabels"] == want]

    def wait_for(self, what: str, check: Callable[[], list[Any]], timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := check():
                return found
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout:.0f}s; got {self.received}")


@contextmanager
def receiver() -> Iterator[Receiver]:
    got: list[tuple[float, dict[str, Any]]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((time.monotonic(), json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, name="webhook")
    thread.start()
    try:
        yield Receiver(f"http://127.0.0.1:{server.server_address[1]}/alerts", got)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def shipped_config(hook: str) -> dict[str, Any]:
    """The shipped config, its receiver pointed at ``hook`` and group_interval cut to 5 s."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    config["route"]["group_interval"] = "5s"
    config["receivers"][0]["webhook_configs"][0]["url"] = hook
    return config


def am_alerts(address: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{address}/api/v2/alerts", timeout=5) as r:
        alerts: list[dict[str, Any]] = json.load(r)
        return alerts


def test_the_shipped_config_passes_amtool():
    amtool = shutil.which("amtool")
    assert amtool, "amtool missing: apt-get install -y prometheus-alertmanager"
    result = subprocess.run(
        [amtool, "check-config", str(SHIPPED)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 inhibit rules" in result.stdout


def relaunch(sim: Simulator, scenario: str) -> Simulator:
    """A new engine process for the same target (port, pid file, log): a supervisor's restart."""
    spec = SimulatorSpec(port=sim.port, scenario=scenario, weights_mb=16, read_mbps=16)
    again = Simulator(sim.port, sim.files, simulator_argv(spec, sim.files))
    again.launch()
    return again


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process and all its descendants (the engine and its workers)."""
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        proc.send_signal(sig)


def fleet_toml(work: Path) -> str:
    """Twenty targets of two models, each a real process found by its pid file."""
    text = ""
    for i in range(FLEET):
        pidfile = work / f"fleet-{i}.pid"
        text += (
            f'[[target]]\nname = "fleet-{i}"\nengine = "vllm"\nmodel = "fleet-{"ab"[i % 2]}"\n'
            f'base_url = "http://127.0.0.1:{free_port()}"\nprobe_timeout = "0.4s"\n'
            f'pidfile = "{pidfile}"\n[target.stall]\n{STALL}\n'
        )
    return text


def go_cold(work: Path) -> list[subprocess.Popen[bytes]]:
    """Start the fleet at once: processes that never answer (a hang before any log line)."""
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(FLEET)]
    for i, proc in enumerate(procs):
        (work / f"fleet-{i}.pid").write_text(str(proc.pid))
    return procs


def with_model(toml: str, model: str) -> str:
    return toml.replace("[[target]]\n", f'[[target]]\nmodel = "{model}"\n', 1)


def test_alerts_reach_a_receiver_through_the_real_alertmanager(tmp_path):
    began = time.monotonic()
    with ExitStack() as stack:
        hook = stack.enter_context(receiver())
        am = stack.enter_context(alertmanager(tmp_path, shipped_config(hook.url)))
        hung = stack.enter_context(simulator(tmp_path, weights_mb=64, read_mbps=4, launch=False))
        crashy = stack.enter_context(simulator(tmp_path, launch=False))
        targets = (
            with_model(target_toml("hung", hung, stall=STALL, interval=INTERVAL), "hung-model")
            + with_model(target_toml("crashy", crashy, stall=STALL, interval=INTERVAL), "crashy")
            + fleet_toml(tmp_path)
        )
        exp = stack.enter_context(exporter(tmp_path, targets, interval=INTERVAL))
        prom = stack.enter_context(
            prometheus(tmp_path, f"127.0.0.1:{exp.port}", rules=RULES, alertmanager=am, scrape="3s")
        )
        fleet = go_cold(tmp_path)
        for proc in fleet:
            stack.callback(stop, proc)
        hung.launch()
        loop = CrashLoop(crashy, hook)
        stack.callback(loop.stop)
        loop.start()

        stalled_at = _stop_the_load(exp, hung)
        firing = _assert_the_stall_page(hook, stalled_at)
        signal_tree(hung.main_pid(), signal.SIGCONT)
        _assert_resolved(hook, firing)
        exp.wait_for(lambda t: t["phase"] == "serving", "hung", timeout=60)

        _assert_one_failure_notification(exp, hook, loop)
        _assert_the_crash_loops_stall_is_inhibited(prom, am, hook)
        _assert_the_fleet_pages_once_per_model(hook)
    print(f"whole alerting test: {time.monotonic() - began:.0f}s")


def _stop_the_load(exp: Exporter, hung: Simulator) -> float:
    """Freeze the engine mid-load; return when the exporter flagged the stall (monotonic)."""
    exp.wait_for(lambda t: t["phase"] == "loading", "hung", timeout=30)
    signal_tree(hung.main_pid(), signal.SIGSTOP)
    exp.wait_for(lambda t: t["stalled"], "hung", timeout=30)
    return time.monotonic()


def _assert_the_stall_page(hook: Receiver, stalled_at: float) -> Any:
    """The stall notification, as a person would read it."""
    got = hook.wait_for(
        "stall notification",
        lambda: hook.notifications(STALLED, model="hung-model"),
        timeout=150,
    )
    at, note = got[0]
    print(
        f"stall to notification: {at - stalled_at:.1f}s (shipped for: 1m, group_wait: 30s;"
        " Prometheus evaluating every 1s, scraping every 3s)"
    )
    assert note["status"] == "firing"
    [alert] = note["alerts"]
    labels: dict[str, str] = alert["labels"]
    ann: dict[str, str] = alert["annotations"]
    assert labels["target"] == "hung" and labels["model"] == "hung-model"
    assert labels["instance"].startswith("127.0.0.1:") and labels["severity"] == "critical"
    assert ann["phase"] == "loading"
    assert ann["reason"].startswith("no progress evidence for ")
    assert ann["reason"].endswith("disk reads, GPU memory, CPU, processes and logs all quiet")
    assert ann["last_progress"].endswith(" +0000 UTC")
    assert ann["page"] == f"http://{labels['instance']}/"
    assert ann["runbook_url"].endswith("/docs/runbooks/InferenceColdStartStalled.md")
    assert "hung (hung-model) on 127.0.0.1:" in ann["description"]
    return alert


def _assert_resolved(hook: Receiver, firing: dict[str, Any]) -> None:
    got = hook.wait_for(
        "resolved notification",
        lambda: [
            n
            for _, n in hook.notifications(STALLED, model="hung-model")
            if n["status"] == "resolved"
        ],
        timeout=60,
    )
    [alert] = got[0]["alerts"]
    assert alert["status"] == "resolved"
    assert alert["fingerprint"] == firing["fingerprint"]


class CrashLoop:
    """A supervisor restarting a crashing engine: on after the first page, then it hangs."""

    def __init__(self, sim: Simulator, hook: Receiver) -> None:
        self.sim, self.hook = sim, hook
        self.crashes = 0
        self.after_page = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crash-loop")
        self.last: Simulator | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        # Crash until the failure has been paged, twice more, then an attempt that hangs.
        while not self._done.is_set():
            paged = bool(self.hook.notifications(FAILED, model="crashy"))
            if paged and self.after_page >= 2:
                break
            self._one(relaunch(self.sim, "crash-loading"))
            self.crashes += 1
            self.after_page += paged
            self._done.wait(1.0)  # a supervisor's restart delay
        if not self._done.is_set():
            self.last = relaunch(self.sim, "hang-loading")

    def _one(self, sim: Simulator) -> None:
        assert sim.proc is not None
        try:
            sim.proc.wait(timeout=60)
        finally:
            stop(sim.proc)
            if sim.proc.stdout:
                sim.proc.stdout.close()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        if self.last is not None and self.last.proc is not None:
            stop(self.last.proc)
            if self.last.proc.stdout:
                self.last.proc.stdout.close()


def _assert_one_failure_notification(exp: Exporter, hook: Receiver, loop: CrashLoop) -> None:
    hook.wait_for("the crash loop's end", lambda: [loop.last] if loop.last else [], timeout=90)
    failures = sum(
        float(line.rsplit(" ", 1)[1])
        for line in exp.metrics().splitlines()
        if line.startswith("inference_server_start_failures_total{") and 'target="crashy"' in line
    )
    assert failures >= 3, f"{failures} failed starts counted for {loop.crashes} crashes"
    time.sleep(6)  # past one more group_interval: a later failure would have been sent by now
    pages = hook.notifications(FAILED, model="crashy")
    print(
        f"crash loop: {loop.crashes} crashes, {failures:.0f} failed starts,"
        f" {len(pages)} failed-start notification"
    )
    assert len(pages) == 1
    assert {a["labels"]["target"] for a in pages[0][1]["alerts"]} == {"crashy"}


def _assert_the_crash_loops_stall_is_inhibited(prom: Any, am: str, hook: Receiver) -> None:
    prom.wait_for(
        f'ALERTS{{alertname="{STALLED}",target="crashy",alertstate="firing"}}',
        "the crash loop's stall alert",
        timeout=100,
    )

    def suppressed() -> list[dict[str, Any]]:
        return [
            a
            for a in am_alerts(am)
            if a["labels"]["alertname"] == STALLED and a["labels"]["target"] == "crashy"
        ]

    [alert] = hook.wait_for("the stall alert in Alertmanager", suppressed, timeout=30)
    assert alert["status"]["state"] == "suppressed"
    assert alert["status"]["inhibitedBy"]
    assert hook.notifications(STALLED, model="crashy") == []


def _assert_the_fleet_pages_once_per_model(hook: Receiver) -> None:
    def both() -> list[Any]:
        a = hook.notifications(STALLED, model="fleet-a")
        b = hook.notifications(STALLED, model="fleet-b")
        return [a, b] if a and b else []

    hook.wait_for("the fleet's notifications", both, timeout=60)
    time.sleep(6)  # one more group_interval: stragglers would arrive now
    pages = hook.notifications(STALLED, model="fleet-a") + hook.notifications(
        STALLED, model="fleet-b"
    )
    alerted = {a["labels"]["target"] for _, n in pages for a in n["alerts"]}
    print(f"fleet of {FLEET} going cold at once: {len(pages)} notifications")
    assert alerted == {f"fleet-{i}" for i in range(FLEET)}
    assert len(pages) <= 4
