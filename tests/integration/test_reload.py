"""SIGHUP reloads the config; an invalid one is refused and the running config stays."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import (
    ROOT,
    Exporter,
    Simulator,
    exporter,
    free_port,
    simulator,
    target_toml,
)

pytestmark = pytest.mark.integration
# A TOML escape: the string holds a real tab. urllib took it, httpx raised InvalidURL.
TAB_URL = 'base_url = "http://127.0.0.1:8000\\t"'


def ready(port: int) -> bool:
    """Whether the exporter on ``port`` answers /-/ready with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def one_ready_target(tmp_path: Path) -> Iterator[tuple[Simulator, Exporter, Path]]:
    """A simulator, an exporter watching it as target "one" once ready, and its config."""
    with (
        simulator(tmp_path, init_seconds=0.5) as sim,
        exporter(tmp_path, target_toml("one", sim, completion=False), interval=0.25) as exp,
    ):
        exp.wait_for(lambda t: t["ready"], "one")
        yield sim, exp, next(tmp_path.glob("config-*.toml"))


def reload_refused(exp: Exporter, config: Path, added: str) -> None:
    """Append to the running config, SIGHUP, and wait for the refusal in the log."""
    config.write_text(config.read_text() + added)
    exp.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "config reload failed" not in exp.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "config reload failed, keeping the running config" in exp.log_text()


def test_sighup_with_an_invalid_config_keeps_the_old_one_then_a_valid_one_applies(tmp_path):
    with one_ready_target(tmp_path) as (sim, exp, config):
        good = config.read_text()
        reload_refused(exp, config, "\n[[target]]\nname = 'two'\nbase_url = 'gopher://x'\n")
        assert "target[1].base_url: scheme must be http or https" in exp.log_text()
        assert [t["target"] for t in exp.status()["targets"]] == ["one"]
        assert exp.target("one")["ready"]
        # a valid change applies, and the kept target keeps its state
        config.write_text(
            good + f"\n[[target]]\nname = 'two'\nbase_url = 'http://127.0.0.1:{sim.port}'\n"
        )
        exp.proc.send_signal(signal.SIGHUP)
        doc = exp.wait_for(lambda t: t["ready"], "two", timeout=10)
        assert doc["target"] == "two"
        one = exp.target("one")
        assert one["ready"] and one["transitions"], "target one kept its history"
        assert exp.proc.poll() is None


def test_sighup_with_a_url_the_http_client_refuses_keeps_the_loop_serving(tmp_path):
    with one_ready_target(tmp_path) as (_sim, exp, config):
        reload_refused(exp, config, f'\n[[target]]\nname = "two"\n{TAB_URL}\n')
        # the loop still ticks: snapshots keep coming after the refused reload
        before = exp.status()["taken_at"]
        deadline = time.monotonic() + 10
        while exp.status()["taken_at"] <= before + 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exp.status()["taken_at"] > before + 0.5, "the loop stopped after SIGHUP"
        assert [t["target"] for t in exp.status()["targets"]] == ["one"]
        assert exp.proc.poll() is None
        assert "Traceback" not in exp.log_text()


def test_sighup_while_run_reads_its_config_reloads_and_never_kills_it(tmp_path):
    """Before: a SIGHUP in the first ~0.7 s (imports, the config) ended ``run`` with 129.

    The config is a FIFO, so the test knows ``run`` is inside its start-up: opening the FIFO
    to write returns once ``run`` opened it to read, and ``run`` waits there for the text.
    """
    port = free_port()
    config = tmp_path / "config.toml"
    os.mkfifo(config)
    argv = [sys.executable, "-m", "exporter", "run", "--config.file", str(config)]
    proc = subprocess.Popen(
        [*argv, "--web.listen-address", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    plain = tmp_path / "config.plain"
    plain.write_text(f'[exporter]\ninterval = "0.25s"\nstate_directory = "{tmp_path}"\n')
    try:
        with open(config, "w") as fifo:  # returns once run opened its config
            for _ in range(5):
                proc.send_signal(signal.SIGHUP)
                time.sleep(0.05)
            assert proc.poll() is None, proc.communicate()[1]
            fifo.write(plain.read_text())
            os.replace(plain, config)  # later reads (a reload) find a plain file
        deadline = time.monotonic() + 20
        while not ready(port):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
