"""``wait``: every exit code against real simulator scenarios, in daemon and standalone mode.

The integration tests share one world: four simulated engines and one exporter process start
together, and every ``wait`` process starts at once, each following its own scenario, so the
whole set costs about one cold start. The rest renders hand-built status documents.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.base.model import FailureReason, GpuSample, LogClass, LogEvent, Phase, ProcessSample
from exporter.base.records import ColdStart
from exporter.base.units import format_bytes, format_duration
from exporter.commands.client import shown_url
from exporter.commands.text import eta_text, live_line, notable_lines, sparkline
from exporter.commands.verdict import judge
from exporter.commands.wait_standalone import process_gone, standalone_targets
from exporter.core.lifecycle import initial_state
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.render.status import render_status
from tests.httpservers import LoopbackServer, closed_port, reply
from tests.integration.harness import ROOT, exporter, simulator, target_toml

T0 = 1_700_000_000.0
GiB = 2**30
INTERVAL = 0.25
WAIT = [sys.executable, "-m", "exporter", "wait", "--interval", "0.2"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real command line to completion (``args`` start with the subcommand)."""
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


# --- hand-built status documents ------------------------------------------------------------


def target_doc(**state_fields) -> dict:
    """One target's /status document, rendered by the real render_status."""
    typical = state_fields.pop("typical", None)
    recent = state_fields.pop("recent_starts", ())
    state = replace(initial_state("kimi"), **state_fields)
    process = ProcessSample(9, T0, (9, 10), 14 * GiB, 30.0, 80 * GiB)
    gpus = tuple(GpuSample(i, f"GPU-{i}", "H100", True, 31 * GiB, 80 * GiB) for i in (0, 1))
    snap = Snapshot(
        taken_at=T0 + 72,
        targets=(
            TargetSnapshot(
                TargetInfo("kimi", "sglang"),
                state,
                process,
                ((0, 31 * GiB), (1, 31 * GiB)),
                typical_start_seconds=typical,
                recent_starts=recent,
            ),
        ),
        gpus=gpus,
    )
    return render_status(snap)["targets"][0]


def loading(**extra):
    fields = {
        "phase": Phase.LOADING,
        "phase_since": T0 + 5,
        "create_time": T0,
        "started_at": T0,
        "phase_seconds": ((Phase.STARTING, 5.0),),
        "progress_ratio": 0.48,
        "eta_seconds": 65.0,
        "reason": "GPU memory climbing",
    }
    return target_doc(**{**fields, **extra})


def test_durations_and_sizes_read_like_an_operator_writes_them():
    assert [format_duration(s) for s in (None, 0, 42.4, 640, 3600 + 300)] == [
        "-",
        "0s",
        "42s",
        "10m40s",
        "1h05m",
    ]
    assert format_bytes(31.2 * GiB) == "31.2 GiB"
    assert format_bytes(240 * 2**20) == "240.0 MiB"
    assert format_bytes(2048 * GiB) == "2.0 TiB"


def test_live_line_shows_phase_bar_progress_elapsed_gpus_read_rate_and_history_eta():
    doc = loading(typical=640.0)
    line = live_line(doc, 240 * 2**20)
    assert line.startswith("kimi loading ")
    for part in ("48%", "1m12s", "GPU 2x 31.0 GiB", "read 240.0 MiB/s", "ETA 1m05s"):
        assert part in line
    assert line.endswith("usually ready in 10m40s")
    assert "█" in line and "░" in line
    assert "#" in live_line(doc, None, unicode=False)


def test_without_history_the_previous_start_stands_in_for_usually():
    prev = ColdStart(T0 - 900, T0 - 260, "ready", None, ((Phase.LOADING, 600.0),), (), None, None)
    doc = loading(last_cold_start=prev)
    assert eta_text(doc) == "ETA 1m05s · last start took 10m40s"
    assert doc["previous_cold_start"]["duration_seconds"] == 640.0


def test_status_keeps_the_previous_start_once_this_one_is_ready():
    prev = ColdStart(T0 - 900, T0 - 260, "ready", None, ((Phase.LOADING, 600.0),), (), None, None)
    this = ColdStart(T0, T0 + 45, "ready", None, ((Phase.LOADING, 40.0),), (), None, None)
    fields = {"phase": Phase.READY, "phase_since": T0 + 45, "last_cold_start": this}
    alone = loading(**fields)  # without history the only finished start is this one
    assert alone["previous_cold_start"] is None
    assert [(r["phase"], r["running"]) for r in alone["timeline"]] == [("starting", False)]
    doc = target_doc(**{**fields, "create_time": T0, "started_at": T0}, recent_starts=(this, prev))
    assert doc["previous_cold_start"]["started_at"] == T0 - 900


def test_timeline_measures_the_running_phase_up_to_the_snapshot():
    rows = loading()["timeline"]
    assert rows == [
        {"phase": "starting", "seconds": 5.0, "running": False},
        {"phase": "loading", "seconds": 67.0, "running": True},
    ]
    assert loading()["gpu_memory"] == [
        {"gpu": 0, "used_bytes": 31 * GiB, "total_bytes": 80 * GiB},
        {"gpu": 1, "used_bytes": 31 * GiB, "total_bytes": 80 * GiB},
    ]


def test_judge_maps_phases_to_exit_codes():
    assert judge(loading(), "ready") is None
    ready = loading(phase=Phase.READY, phase_seconds=((Phase.STARTING, 5.0), (Phase.LOADING, 40.0)))
    assert judge(ready, "ready").code == 0
    assert "cold start took 45s" in judge(ready, "ready").summary
    assert judge(ready, "serving") is None
    assert judge(loading(phase=Phase.SERVING), "serving").code == 0
    failed = judge(loading(phase=Phase.FAILED, failure_reason=FailureReason.OOM), "ready")
    assert failed.code == 1 and "oom" in failed.summary
    stalled = judge(loading(stalled=True, stall_reason="no progress evidence for 301s"), "ready")
    assert stalled.code == 1 and "stalled in loading" in stalled.summary


def test_notable_lines_drop_benign_noise_and_keep_the_last_five():
    events = tuple(LogEvent(LogClass.ERROR, f"error {i}", T0 + i) for i in range(7))
    noise = LogEvent(LogClass.BENIGN, "Unexpected error during packing", T0 + 8)
    lines = notable_lines(loading(notable_lines=(*events, noise)))
    assert len(lines) == 5
    assert lines[-1].split()[1:] == ["error", "error", "6"]
    assert not any("packing" in line for line in lines)


def test_standalone_urls_become_prober_targets():
    class Args:
        health_url = "http://127.0.0.1:8000/v2/health/ready?verbose=1"
        completion_url = "https://gw.example:8443/llm/v1/completions"
        model, prompt, probe_timeout = "m", "2+2=", 5.0
        api_key_file, api_key_env = None, "KEY"

    health, comp = standalone_targets(Args())
    assert health.health_url == "http://127.0.0.1:8000/v2/health/ready?verbose=1"
    assert comp is not None and comp.base_url == "https://gw.example:8443/llm"
    assert comp.completion is not None and comp.completion.model == "m"
    assert comp.api_key_env == "KEY"


def test_printed_urls_drop_credentials():
    assert shown_url("https://admin:s3cret@host:9443/x?token=t") == "https://host:9443/x"


def test_process_gone_sees_exited_and_zombie_processes(tmp_path):
    with subprocess.Popen(["sleep", "30"]) as alive, subprocess.Popen(["true"]) as zombie:
        deadline = time.monotonic() + 5
        while not process_gone(zombie.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # not reaped yet: a zombie, which must count as gone
        assert process_gone(zombie.pid)
        assert not process_gone(alive.pid)
        alive.kill()
    assert process_gone(alive.pid)


# --- the shared world of real processes -----------------------------------------------------


class Waits:
    """``wait`` processes started together; results collected per name."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.head: dict[str, str] = {}
        self.tty: dict[str, tuple[subprocess.Popen[bytes], bytearray, threading.Thread]] = {}

    def start(self, name: str, *args: str) -> None:
        self.procs[name] = subprocess.Popen(
            [*WAIT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )
        self.head[name] = ""

    def attached(self, *names: str) -> None:
        """Block until each wait printed its first state line (Python starts slowly when busy)."""
        for name in names:
            if name in self.tty:
                seen = self.tty[name][1]
                deadline = time.monotonic() + 30
                while b"[" not in seen and time.monotonic() < deadline:
                    time.sleep(0.05)
                continue
            stdout = self.procs[name].stdout
            assert stdout is not None
            while line := stdout.readline():
                self.head[name] += line
                if line.startswith("["):
                    break

    def start_tty(self, name: str, *args: str) -> None:
        """Run with stdout on a pseudo-terminal, as an operator's shell would."""
        master, slave = pty.openpty()
        env = {**os.environ, "COLUMNS": "140"}
        proc = subprocess.Popen([*WAIT, *args], stdout=slave, stderr=slave, cwd=ROOT, env=env)
        os.close(slave)
        seen = bytearray()

        def read() -> None:
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO once the child closed the terminal
                    break
                if not chunk:
                    break
                seen.extend(chunk)
            os.close(master)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        self.tty[name] = (proc, seen, reader)

    def result(self, name: str, timeout: float = 90) -> tuple[int, str, str]:
        out, err = self.procs[name].communicate(timeout=timeout)
        return self.procs[name].returncode, self.head[name] + out, err

    def tty_result(self, name: str, timeout: float = 90) -> tuple[int, str]:
        proc, seen, reader = self.tty[name]
        proc.wait(timeout=timeout)
        reader.join(timeout=5)
        return proc.returncode, seen.decode("utf-8", errors="replace")

    def close(self) -> None:
        for proc in [*self.procs.values(), *(p for p, _, _ in self.tty.values())]:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def add_target(exp, toml: str) -> None:
    """Append a target to the running exporter's config and reload it (SIGHUP)."""
    config = exp.stderr_path.parent / f"config-{exp.port}.toml"
    config.write_text(config.read_text() + toml)
    exp.proc.send_signal(signal.SIGHUP)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("wait")
    stall = 'starting = "20s"\nloading = "2s"\ninitializing = "20s"'
    with contextlib.ExitStack() as stack:
        crash = stack.enter_context(simulator(work, gpus=1, scenario="crash-loading"))
        hang = stack.enter_context(
            simulator(work, gpus=1, scenario="hang-loading", weights_mb=32, read_mbps=16)
        )
        stuck = stack.enter_context(simulator(work, gpus=1, scenario="hang-initializing"))
        toml = (
            target_toml("crash", crash, interval=INTERVAL)
            + target_toml("hang", hang, stall=stall, interval=INTERVAL)
            + target_toml("stuck", stuck, interval=INTERVAL, completion=False)
        )
        exp = stack.enter_context(exporter(work, toml, interval=INTERVAL))
        # Launched only once the waits on it attached to it while it is down: on a busy
        # machine a Python process can take seconds to start, and these tests watch whole
        # starts (the live line its load, however long the waits took to start).
        ok = stack.enter_context(
            simulator(work, gpus=1, start_seconds=5.0, init_seconds=1.0, launch=False)
        )
        add_target(exp, target_toml("ok", ok, interval=INTERVAL))
        exp.wait_for(lambda t: t["target"] == "ok", "ok", timeout=20)
        waits = stack.enter_context(contextlib.closing(Waits(work)))
        start_ok_waits(waits, exp.url, ok)
        ok.launch()
        # Standalone, a crash is seen only after a first answer: attach before it listens.
        llama = stack.enter_context(
            simulator(
                work,
                gpus=1,
                scenario="crash-loading",
                engine="llamacpp",
                start_seconds=3.0,
                read_mbps=4.0,
            )
        )
        llama_health = f"http://127.0.0.1:{llama.port}/health"
        waits.start("alone-gone", "--health-url", llama_health, "--timeout", "30s")
        waits.attached("alone-gone")
        start_other_waits(waits, exp.url, crash, stuck)
        yield waits, exp


def start_ok_waits(waits: Waits, url: str, ok) -> None:
    waits.start("serving", "ok", "--until", "serving", "--url", url)
    waits.start_tty("tty", "ok", "--until", "serving", "--url", url)
    base = f"http://127.0.0.1:{ok.port}"
    waits.start(
        "alone-serving",
        *("--health-url", f"{base}/health", "--completion-url", f"{base}/v1/completions"),
        *("--model", "m", "--until", "serving"),
    )
    waits.attached("serving", "tty", "alone-serving")


def start_other_waits(waits: Waits, url: str, crash, stuck) -> None:
    """Waits whose verdict does not depend on when they attach."""
    daemon = ("--url", url)
    waits.start("ready", "ok", *daemon)
    waits.start("crash", "crash", *daemon)
    waits.start("hang", "hang", *daemon)
    waits.start("timeout", "stuck", "--timeout", "2s", *daemon)
    crash_health = f"http://127.0.0.1:{crash.port}/health"
    waits.start("alone-pid", "--health-url", crash_health, "--pid", str(crash.main_pid()))
    stuck_health = f"http://127.0.0.1:{stuck.port}/health"
    waits.start("alone-timeout", "--health-url", stuck_health, "--timeout", "2s")


@pytest.mark.integration
def test_exit_0_when_serving_with_one_line_per_phase_change(world):
    code, out, err = world[0].result("serving")
    assert code == 0, out + err
    lines = out.splitlines()
    phases = [re.match(r"\[ *\S+\] ok (\w+):", line).group(1) for line in lines[:-1]]
    # It attaches before the engine is launched, then prints exactly one line for each
    # later change.
    order = ["down", "starting", "loading", "initializing", "ready", "serving"]
    assert phases == order[order.index(phases[0]) :], out
    assert len(phases) >= 3, out
    assert lines[-1].startswith("ok is serving (cold start took ")
    assert "\r" not in out  # not a terminal: no live line


@pytest.mark.integration
def test_exit_0_when_ready(world):
    code, out, err = world[0].result("ready")
    assert code == 0, out + err
    assert "ok is ready" in out or "ok is serving" in out


@pytest.mark.integration
def test_on_a_terminal_one_live_line_is_redrawn_in_place(world):
    code, out = world[0].tty_result("tty")
    assert code == 0, out
    live = [part for part in out.split("\r\x1b[K") if part.startswith("ok ")]
    assert len(live) >= 3, out
    assert any("%" in part and ("█" in part or "░" in part) for part in live), live
    # GPU memory and the read rate with a sparkline of the last polls beside them
    assert any(re.search("read .*/s [▁▂▃▄▅▆▇█ ]*[▂▃▄▅▆▇█]", part) for part in live), live
    assert "ok is serving" in out


@pytest.mark.integration
def test_exit_1_with_reason_and_notable_lines_when_the_start_fails(world):
    code, out, err = world[0].result("crash")
    assert code == 1, out + err
    assert "crash failed after" in err and "crash" in err
    assert "last notable log lines:" in err
    assert "fatal" in err.split("last notable log lines:")[1]


@pytest.mark.integration
def test_exit_1_when_the_start_stalls(world):
    code, out, err = world[0].result("hang")
    assert code == 1, out + err
    assert "hang stalled in loading" in err
    assert "no progress evidence" in err


@pytest.mark.integration
def test_exit_124_on_timeout_with_where_it_got(world):
    code, _, err = world[0].result("timeout")
    assert code == 124
    assert "stuck: timed out after 2s waiting for ready;" in err


@pytest.mark.integration
def test_exit_2_for_an_unknown_target_lists_the_known_ones(world):
    exp = world[1]
    done = cli("wait", "nope", "--url", exp.url)
    assert done.returncode == 2
    assert "no target named 'nope'" in done.stderr
    assert "known targets: crash, hang, ok, stuck" in done.stderr


@pytest.mark.integration
def test_exit_2_when_the_exporter_is_unreachable_says_what_to_do():
    url = f"http://user:pw@127.0.0.1:{closed_port()}"
    done = cli("wait", "demo", "--url", url)
    assert done.returncode == 2
    assert "cannot reach the exporter at http://127.0.0.1:" in done.stderr
    assert "connection refused" in done.stderr
    assert "--health-url" in done.stderr and "--url" in done.stderr
    assert "pw" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "name a TARGET"),
        (["demo", "--health-url", "http://h/health"], "not both"),
        (["--health-url", "http://h/health", "--until", "serving"], "needs --completion-url"),
        (["--health-url", "http://h/health", "--completion-url", "http://h/x"], "needs --model"),
        (["--health-url", "ftp://h/health"], "needs http(s)://"),
        (["demo", "--url", "http://h:port"], "--url: http://h:port: the port is not a number"),
        (["demo", "--timeout", "soon"], "is not a duration"),
    ],
)
def test_exit_2_for_usage_errors(args, message):
    done = cli("wait", *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_help_documents_every_exit_code():
    done = cli("wait", "--help")
    for code in ("0 ", "1 ", "2 ", "124", "130"):
        assert f"\n  {code}" in done.stdout


# --- standalone mode ------------------------------------------------------------------------


@pytest.mark.integration
def test_standalone_exit_0_once_a_completion_returns_choices(world):
    code, out, err = world[0].result("alone-serving")
    assert code == 0, out + err
    assert "health: refused" in out or "health: 503" in out, out
    assert "health: 200" in out and "completion: 200 with choices" in out, out
    assert out.splitlines()[-1].startswith("serving after "), out


@pytest.mark.integration
def test_standalone_exit_1_when_the_watched_process_exits(world):
    code, _, err = world[0].result("alone-pid")
    assert code == 1
    assert "exited before ready" in err


@pytest.mark.integration
def test_standalone_exit_1_when_a_server_that_answered_stops_listening(world):
    code, out, err = world[0].result("alone-gone")
    assert code == 1, out + err
    assert "health: 503 loading" in out
    assert "stopped listening after it had answered" in err


@pytest.mark.integration
def test_standalone_exit_124_on_timeout(world):
    code, _, err = world[0].result("alone-timeout")
    assert code == 124
    assert "timed out after 2s waiting for ready; last health: " in err


@pytest.mark.integration
def test_standalone_exit_2_when_the_server_wants_a_key():
    with LoopbackServer({"/health": reply(401)}) as server:
        done = cli("wait", "--health-url", server.url + "/health")
    assert done.returncode == 2
    assert "answered 401/403: pass --api-key-file or --api-key-env" in done.stderr


@pytest.mark.integration
def test_exit_2_when_the_exporter_wants_credentials_and_they_travel_in_the_url():
    with LoopbackServer({"/status": reply(401)}) as locked:
        done = cli("wait", "demo", "--url", locked.url)
    assert done.returncode == 2
    assert "asks for credentials: pass --url https://USER:PASSWORD@HOST" in done.stderr
    doc = {"ready": True, "targets": [{"target": "kimi", "phase": "loading"}]}
    with LoopbackServer({"/status": reply(200, doc)}) as server:
        done = cli("wait", "demo", "--url", server.url.replace("//", "//alice:pw@"))
        sent = server.requests[0].headers["authorization"]
    assert sent == "Basic YWxpY2U6cHc="  # alice:pw
    assert done.returncode == 2 and "known targets: kimi" in done.stderr


def test_sparklines_scale_to_the_largest_value_and_leave_unknowns_blank():
    assert sparkline([0, 1, 2, 4, None, 8]) == "▁▂▃▅ █"
    assert sparkline([None, 0.0]) == ""  # nothing to draw
    assert sparkline([1, 2], unicode=False) == "+@"
