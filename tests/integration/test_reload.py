"""SIGHUP reloads the config; an invalid one is refused and the running config stays."""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.harness import exporter, simulator, target_toml

pytestmark = pytest.mark.integration


def test_sighup_with_an_invalid_config_keeps_the_old_one_then_a_valid_one_applies(tmp_path):
    with (
        simulator(tmp_path, init_seconds=0.5) as sim,
        exporter(tmp_path, target_toml("one", sim, completion=False), interval=0.25) as exp,
    ):
        exp.wait_for(lambda t: t["ready"], "one")
        config = next(tmp_path.glob("config-*.toml"))
        good = config.read_text()
        config.write_text(good + "\n[[target]]\nname = 'two'\nbase_url = 'gopher://x'\n")
        exp.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "config reload failed" not in exp.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "config reload failed, keeping the running config" in exp.log_text()
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
