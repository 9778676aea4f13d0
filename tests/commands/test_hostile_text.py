"""Names and engine text from others reach logs and terminals inert (issue 30 #7).

A pod name or a compose label may hold a newline, an engine's log an ESC sequence: the real
``status``, ``wait`` and ``probe`` commands read them from a served ``/status`` and print them
escaped, and the exporter's own log lines stay one line each.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from exporter.base.model import FailureReason, LogClass, LogEvent, Phase
from exporter.cli import configure_logging
from exporter.core.lifecycle import initial_state
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.render.status import render_status
from tests.commands.test_wait import cli
from tests.httpservers import LoopbackServer, reply

T0 = 1_700_000_000.0
# A terminal title change, a screen clear, a colour, a bidi override, a forged log line.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202eexe.txt\nlevel=error msg=forged"


def hostile_status() -> dict:
    failed = replace(
        initial_state("llama"),
        phase=Phase.FAILED,
        phase_since=T0,
        failure_reason=FailureReason.CRASH,
        reason_detail=f"line 7: {HOSTILE}",
        notable_lines=(LogEvent(LogClass.ERROR, f"engine says {HOSTILE}", T0),),
    )
    named = replace(initial_state(f"pod{HOSTILE}"), phase=Phase.LOADING, phase_since=T0)
    snap = Snapshot(
        taken_at=T0 + 5,
        targets=(
            TargetSnapshot(TargetInfo("llama", "llamacpp"), failed),
            TargetSnapshot(TargetInfo(f"pod{HOSTILE}", f"vllm{HOSTILE}"), named),
        ),
    )
    return render_status(snap)


def assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert not any(line.startswith("level=error msg=forged") for line in text.splitlines())
    assert "\\x1b[31mred\\u202eexe.txt\\nlevel=error" in text, "the text is still shown"


@pytest.mark.integration
def test_status_wait_and_probe_print_hostile_text_escaped():
    routes = {
        "/status": reply(200, hostile_status()),
        "/probe": reply(503, f"llama failed: {HOSTILE}"),
    }
    with LoopbackServer(routes) as server:
        status = cli("status", "--url", server.url)
        waited = cli("wait", "llama", "--url", server.url, "--timeout", "2s")
        probed = cli("probe", "llama", "--url", server.url)
    assert status.returncode == 0, status.stderr
    assert len(status.stdout.splitlines()) == 3, "a header and one line per target"
    assert_inert(status.stdout)
    assert waited.returncode != 0, waited.stderr
    assert "last notable log lines:" in waited.stderr
    assert_inert(waited.stdout + waited.stderr)
    assert probed.returncode == 1
    assert_inert(probed.stdout)


def test_a_hostile_name_cannot_forge_a_line_in_the_exporters_log(capsys):
    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        configure_logging("info", "logfmt")
        logging.getLogger("exporter.daemon").info("target added target=%s", f"pod{HOSTILE}")
    finally:
        root.handlers[:], level = kept
        root.setLevel(level)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert_inert(err)
