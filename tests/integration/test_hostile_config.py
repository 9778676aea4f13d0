"""Configs the checker accepted that killed the daemon, and patterns that froze it (issue 19).

Real exporter processes on loopback: ``run`` with a bad URL, a SIGHUP to one, and a log
pattern with nested quantifiers fed the one line that makes a backtracking engine spin.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error

import pytest

from tests.integration.harness import ROOT, exporter, simulator, target_toml

pytestmark = pytest.mark.integration

# A TOML escape: the string holds a real tab. urllib took it, httpx raised InvalidURL.
TAB_URL = 'base_url = "http://127.0.0.1:8000\\t"'


def test_run_refuses_a_url_the_http_client_would_refuse_with_one_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        f'[exporter]\nstate_directory = "{tmp_path}"\n[[target]]\nname = "a"\n{TAB_URL}\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "run", "--config.file", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr  # was a traceback and exit 1
    assert result.stderr.splitlines() == [
        f"{config}: target[0].base_url: must not contain control characters ('\\t' at position 21)"
    ]


def test_sighup_with_a_url_the_http_client_refuses_keeps_the_loop_serving(tmp_path):
    with (
        simulator(tmp_path, init_seconds=0.5) as sim,
        exporter(tmp_path, target_toml("one", sim, completion=False), interval=0.25) as exp,
    ):
        exp.wait_for(lambda t: t["ready"], "one")
        config = next(tmp_path.glob("config-*.toml"))
        config.write_text(config.read_text() + f'\n[[target]]\nname = "two"\n{TAB_URL}\n')
        exp.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "config reload failed" not in exp.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "config reload failed, keeping the running config" in exp.log_text()
        # the loop still ticks: snapshots keep coming after the refused reload
        before = exp.status()["taken_at"]
        deadline = time.monotonic() + 10
        while exp.status()["taken_at"] <= before + 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exp.status()["taken_at"] > before + 0.5, "the loop stopped after SIGHUP"
        assert [t["target"] for t in exp.status()["targets"]] == ["one"]
        assert exp.proc.poll() is None
        assert "Traceback" not in exp.log_text()


def _fatal_lines(doc: dict[str, object]) -> list[str]:
    lines = doc["notable_lines"]
    assert isinstance(lines, list)
    return [line["text"] for line in lines if line["class"] == "fatal"]


def test_a_catastrophic_user_pattern_cannot_freeze_the_exporter(tmp_path):
    # "(a+)+$" against a long run of "a" ending in another character: Python's re tries
    # every way to split the run (2^n) holding the GIL; scrapes and /-/healthy stopped too.
    with simulator(tmp_path, init_seconds=0.5) as engine:
        targets = target_toml("one", engine, completion=False)
        targets += '[target.log]\nfatal = ["(a+)+$"]\n'
        with exporter(tmp_path, targets, interval=0.25) as exp:
            exp.wait_for(lambda t: t["ready"], "one")
            with engine.log_file.open("a") as log:
                log.write("a" * 2000 + "!\n")
                log.write("engine gave up aaaa\n")
            deadline, fatal = time.monotonic() + 20, []
            while not fatal and time.monotonic() < deadline:
                try:
                    exp.get("/-/healthy", timeout=2.0)
                    fatal = _fatal_lines(exp.target("one"))
                except (urllib.error.URLError, TimeoutError) as exc:
                    raise AssertionError(f"the exporter stopped answering: {exc}") from exc
                time.sleep(0.1)
            # the line after the hostile one was classified by the user pattern
            assert any("engine gave up aaaa" in text for text in fatal), fatal
            assert exp.proc.poll() is None
