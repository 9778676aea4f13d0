"""``status`` and ``wait`` say what bounds a start: the advice line from ``/status``."""

from __future__ import annotations

from dataclasses import replace

from exporter.base.model import Phase
from exporter.commands.status import render_table
from exporter.commands.verdict import EXIT_REACHED, judge
from exporter.core.advice import THRESHOLDS, verdicts
from exporter.core.bounds import Bounds, PhaseFigures, StartFigures
from exporter.core.lifecycle import initial_state
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.render.status import render_status

T0 = 1_700_000_000.0
GiB = 2**30


def status(phase: Phase, *, finished: bool):
    figures = (
        PhaseFigures(Phase.STARTING, 20.0, cpu_seconds=30.0),
        PhaseFigures(Phase.LOADING, 552.0, read_bytes=610 * GiB),
    )
    start = StartFigures(9, T0, figures, finished=finished)
    judged = verdicts(Bounds(start, best_read_bytes_per_second=1.15 * GiB), THRESHOLDS)
    state = replace(
        initial_state("kimi"),
        phase=phase,
        phase_since=T0 + 20,
        create_time=T0,
        started_at=T0,
        phase_seconds=((Phase.STARTING, 20.0), (Phase.LOADING, 552.0)),
    )
    snap = Snapshot(
        taken_at=T0 + 580,
        targets=(TargetSnapshot(TargetInfo("kimi", "sglang"), state, verdicts=judged),),
    )
    return render_status(snap)


def test_wait_ends_with_the_slowest_phase_and_its_bound():
    doc = status(Phase.READY, finished=True)["targets"][0]
    verdict = judge(doc, "ready")
    assert verdict is not None and verdict.code == EXIT_REACHED
    assert verdict.summary == (
        "kimi is ready (cold start took 9m32s); slowest phase loading 9m12s: read 610.0 GiB "
        "at 1.1 GiB/s; this disk's best seen 1.1 GiB/s: disk-bound"
    )


def test_status_prints_the_running_phase_advice_under_the_table():
    lines = render_table(status(Phase.LOADING, finished=False)).splitlines()
    assert lines[0].startswith("TARGET") and lines[1].startswith("kimi")
    assert lines[2].startswith("kimi: loading 9m12s: read 610.0 GiB at 1.1 GiB/s")
    assert lines[2].endswith("disk-bound")
