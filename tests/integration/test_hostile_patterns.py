"""A user pattern with nested quantifiers cannot freeze the exporter (issue 19 #6).

A real exporter process on loopback fed the one line that makes a backtracking engine spin.
"""

from __future__ import annotations

import time
import urllib.error

import pytest

from tests.integration.harness import exporter, simulator, target_toml

pytestmark = pytest.mark.integration


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
