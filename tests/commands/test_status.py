"""``status``: the table from hand-built snapshots, and the command against a real exporter."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from exporter.base.model import FailureReason, Phase
from exporter.base.records import ColdStart
from exporter.commands.client import StatusClient
from exporter.commands.status import COLUMNS, render_table
from exporter.core.lifecycle import initial_state
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.render.status import render_status
from tests.commands.test_wait import cli
from tests.httpservers import closed_port
from tests.integration.harness import ROOT, exporter, simulator, target_toml

T0 = 1_700_000_000.0


def two_targets() -> dict:
    loading = replace(
        initial_state("kimi"),
        phase=Phase.LOADING,
        phase_since=T0 + 5,
        create_time=T0,
        started_at=T0,
        progress_ratio=0.48,
        eta_seconds=65.0,
        last_progress_at=T0 - 230,
        updated_at=T0 + 72,
        stalled=True,
        stall_reason="no progress evidence for 302s in loading",
        last_cold_start=ColdStart(
            T0 - 7200, T0 - 6560, "ready", None, ((Phase.LOADING, 600.0),), (), None, None
        ),
    )
    failed = replace(
        initial_state("llama"),
        phase=Phase.FAILED,
        phase_since=T0 + 10,
        failure_reason=FailureReason.OOM,
        last_cold_start=ColdStart(T0 - 52, T0 + 10, "failed", "oom", (), (), None, None),
    )
    snap = Snapshot(
        taken_at=T0 + 72,
        targets=(
            TargetSnapshot(TargetInfo("kimi", "sglang"), loading),
            TargetSnapshot(TargetInfo("llama", "llamacpp"), failed),
        ),
    )
    return render_status(snap)


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_table_shows_phase_since_progress_eta_stall_and_the_last_cold_start():
    lines = render_table(two_targets()).splitlines()
    assert lines[0].split("  ")[0] == "TARGET"
    assert all(column in lines[0] for column in COLUMNS)
    kimi, llama = (line.split() for line in lines[1:])
    assert kimi[:7] == ["kimi", "sglang", "loading", "(stalled)", "1m07s", "48%", "1m05s"]
    assert "STALLED 5m02s" in lines[1]
    assert cells(lines[1])[-2:] == ["2h01m ago, ready", "10m40s"]
    assert llama[:3] == ["llama", "llamacpp", "failed"]
    assert cells(lines[2])[-2:] == ["2m04s ago, failed (oom)", "1m02s"]


@pytest.mark.parametrize("phase", [Phase.DOWN, Phase.SERVING])
def test_a_down_or_serving_target_is_not_called_quiet(phase):
    # Issue 30 #2: "quiet 1m55s" under STALL for targets that make no start progress.
    state = replace(initial_state("kimi"), phase=phase, phase_since=T0, last_progress_at=T0 - 115)
    doc = render_status(
        Snapshot(
            taken_at=T0,
            targets=(TargetSnapshot(TargetInfo("kimi", "sglang"), replace(state, updated_at=T0)),),
        )
    )
    assert cells(render_table(doc).splitlines()[1])[COLUMNS.index("STALL")] == "-"


def test_columns_line_up():
    lines = render_table(two_targets()).splitlines()
    starts = [
        line.index(cell) for line, cell in zip(lines, ("PHASE", "loading", "failed"), strict=True)
    ]
    assert len(set(starts)) == 1


def test_empty_and_unsampled_exporters_say_so():
    assert render_table(render_status(None), source="http://h:1") == (
        "http://h:1 has not sampled its targets yet\n"
    )
    assert render_table(render_status(Snapshot(taken_at=T0))) == "no targets configured\n"


@pytest.mark.integration
def test_status_against_a_real_exporter(tmp_path):
    toml = f'[[target]]\nname = "gone"\nengine = "vllm"\nbase_url = "http://127.0.0.1:{closed_port()}"\n'
    with exporter(tmp_path, toml) as exp:
        done = cli("status", "--url", exp.url)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.startswith("TARGET")
    assert row.split()[:3] == ["gone", "vllm", "down"]


@pytest.mark.integration
def test_status_exit_2_when_the_exporter_is_unreachable():
    done = cli("status", "--url", f"http://127.0.0.1:{closed_port()}")
    assert done.returncode == 2
    assert "status: cannot reach the exporter" in done.stderr


@pytest.mark.integration
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_status_watch_redraws_with_sparklines_of_the_real_start(tmp_path, stop):
    with (
        simulator(tmp_path, weights_mb=32, read_mbps=8.0, gpus=1) as sim,
        exporter(tmp_path, target_toml("sim", sim, completion=False)) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "loading", "sim", timeout=30)
        _wait_for_reads_to_draw(exp.url, "sim")
        # Started as a script's background job is: with SIGINT ignored (`trap "" INT`), so
        # the command must not rely on the disposition it inherits.
        argv = [sys.executable, "-m", "exporter", "status", "--url", exp.url, "--watch", "0.3"]
        with subprocess.Popen(
            ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        ) as watch:
            try:
                assert watch.stdout is not None
                shown = []  # read until three frames are drawn, however slow the start
                while sum(line.startswith("TARGET") for line in shown) < 3:
                    line = watch.stdout.readline()
                    assert line, watch.stderr.read() if watch.stderr else ""
                    shown.append(line)
                watch.send_signal(stop)
                rest, err = watch.communicate(timeout=10)
            finally:
                watch.kill()
    assert watch.returncode == 0, err
    # The signal may cut the frame being drawn: the last whole one is what a user saw.
    frames = [f for f in ("".join(shown) + rest).split("\n\n") if len(f.splitlines()) >= 2]
    header, row = frames[-1].splitlines()[:2]
    assert header.endswith("GPU MEMORY  READ")
    assert re.search("[▁▂▃▄▅▆▇█]{3,}", row), row  # the read rate over the last ticks


def _wait_for_reads_to_draw(url: str, target: str, timeout: float = 30.0) -> None:
    """Until the ticks the watch draws hold three read rates in a row, one of them reads
    (a busy machine ticks late: a fixed sleep may cover only one or two)."""
    client = StatusClient(url)
    reads: list[float | None] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reads = [r for _, r in client.fetch_trail().get(target, [])]
            in_a_row = any(None not in reads[i : i + 3] for i in range(len(reads) - 2))
            if in_a_row and any(reads):  # and one of them read something: a line to draw
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise AssertionError(f"no three read rates in a row in /trail: {reads}")


def test_the_watch_columns_show_each_targets_sparklines():
    text = render_table(
        two_targets(),
        trails={"kimi": [(1.0, 10.0), (2.0, 20.0), (4.0, None)]},
    )
    header, kimi, llama = text.splitlines()
    assert header.endswith("GPU MEMORY  READ")
    assert kimi.split()[-2:] == ["▃▅█", "▅█"]
    assert llama.split()[-2:] == ["-", "-"]  # no trail: nothing drawn
