"""A reload must never end the loop, whatever the new config holds (issue 19 #2)."""

from __future__ import annotations

import logging

from exporter.config import Settings, Target
from exporter.daemon import Daemon
from exporter.history import History


def test_a_reload_whose_targets_cannot_be_built_keeps_the_running_config(tmp_path, caplog):
    running = Settings(interval_seconds=0.5, state_directory=str(tmp_path), nvml=False)
    daemon = Daemon(running, history=History.open(None))
    # Built past the checker on purpose: whatever slips through it (here a URL the HTTP
    # client raises on while the probe is built) must cost one log line, not the loop.
    broken = Target(
        name="a",
        engine="openai",
        base_url="http://127.0.0.1:8000\t",
        health_path="/health",
        probe_timeout_seconds=0.4,
    )
    try:
        with caplog.at_level(logging.ERROR, logger="exporter.daemon"):
            applied = daemon.reload(lambda: Settings(targets=(broken,), nvml=False))
        assert applied is False
        assert daemon.settings is running
        (record,) = caplog.records
        assert record.getMessage().startswith("config reload failed, keeping the running config")
        assert "\n" not in record.getMessage()
        assert daemon.tick().targets == ()
    finally:
        daemon.close()
