"""SIGHUP reloads the config; an invalid one is refused and the running config stays."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Exporter, Simulator, exporter, simulator, target_toml

pytestmark = pytest.mark.integration
# A TOML escape: the string holds a real tab. urllib took it, httpx raised InvalidURL.
TAB_URL = 'base_url = "http://127.0.0.1:8000\\t"'


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
