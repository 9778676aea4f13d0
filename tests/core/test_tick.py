"""One tick of the core as one call: readings in, new worlds, snapshots and edges out."""

from __future__ import annotations

import pytest

from exporter.base.model import (
    GpuReading,
    HostReadings,
    LogReading,
    ModelSize,
    Phase,
    ProbeKind,
    ProbeOutcome,
    ProbeResult,
    ProcessSample,
)
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import initial_state
from exporter.core.observe import TargetReadings, TargetWorld
from exporter.core.snapshot import TargetInfo
from exporter.core.tick import TargetPlan, advance_tick
from exporter.engines import ENGINES

T0 = 1_700_000_000.0
GIB = 1 << 30
PLAN = TargetPlan(TargetInfo("vllm", "vllm"))


def _world() -> TargetWorld:
    return TargetWorld(initial_state("vllm"), LogClassifier(ENGINES["vllm"].log))


def _process(read: int) -> ProcessSample:
    return ProcessSample(10, T0, (10, 11), GIB, float(read), read)


def _probe(ok: bool, at: float) -> ProbeResult:
    if ok:
        return ProbeResult(ProbeKind.HEALTH, ProbeOutcome.OK, 200, 0.001, at)
    return ProbeResult(ProbeKind.HEALTH, ProbeOutcome.REFUSED, None, 0.001, at)


def _run(readings: list[TargetReadings]):
    world, outcomes = _world(), []
    for i, r in enumerate(readings):
        (outcome,) = advance_tick(
            [world], [r], [PLAN], HostReadings(), GpuReading(gpus=()), T0 + i
        ).targets
        outcomes.append(outcome)
        world = outcome.world
    return outcomes


def _start(ready_at: int, **extra) -> list[TargetReadings]:
    return [
        TargetReadings(process=_process(i * GIB), probe=_probe(i >= ready_at, T0 + i), **extra)
        for i in range(ready_at + 1)
    ]


def test_a_start_comes_back_as_edges_a_finished_start_and_a_snapshot_that_shows_it():
    outcomes = _run(_start(4))

    edges = [(o.phase_edge.before, o.phase_edge.after) for o in outcomes if o.phase_edge]
    assert edges and edges[-1][1] is Phase.READY
    assert outcomes[0].phase_edge is None  # the first tick has nothing to change from
    (finished,) = [o.finished for o in outcomes if o.finished is not None]
    assert outcomes[-1].finished is finished
    # History has it only once the shell wrote it; the page shows it in this very tick.
    assert outcomes[-1].snapshot.recent_starts == (finished,)
    assert all(o.save is not None for o in outcomes[:-1])  # a start in progress is saved


def test_the_worlds_passed_in_are_left_as_they_were():
    world = _world()
    before = world.state
    result = advance_tick([world], _start(0)[:1], [PLAN], HostReadings(), GpuReading(gpus=()), T0)
    assert world.state is before and world.pids == frozenset()
    assert result.targets[0].world.pids == frozenset({10, 11})


def test_the_measured_model_size_sizes_the_start_and_outlives_a_failed_reading():
    readings = _start(3, model_size=ModelSize(5 * GIB))
    readings[2] = TargetReadings(process=_process(2 * GIB), probe=_probe(False, T0 + 2))

    outcomes = _run(readings)

    assert [o.thresholds.weights_bytes for o in outcomes] == [5 * GIB] * 4


def test_a_log_backlog_shows_only_from_a_source_that_can_tell():
    file_log = LogReading((), backlog_bytes=4096, behind_since=T0 - 2)
    journal = LogReading(())

    (behind,) = _run([TargetReadings(logs=file_log)])
    (journald,) = _run([TargetReadings(logs=journal)])

    assert (behind.snapshot.log_backlog_bytes, behind.snapshot.log_lag_seconds) == (4096, 2.0)
    assert (journald.snapshot.log_backlog_bytes, journald.snapshot.log_lag_seconds) == (None, None)


def _restarted(process: ProcessSample, ready: bool) -> list[TargetReadings]:
    """A cold start seen reading the disk, the process killed, then ``process`` at once."""
    return [
        *_start(4),
        TargetReadings(probe=_probe(False, T0 + 5)),
        TargetReadings(process=process, probe=_probe(ready, T0 + 6)),
    ]


def test_a_start_over_within_one_tick_shows_its_own_bounds_not_the_previous_ones():
    # A warm restart: down -> ready in one tick, its weights mapped from the page cache.
    warm = ProcessSample(20, T0 + 5.6, (20,), 2 * GIB, 0.3, 1 << 20)
    outcomes = _run(_restarted(warm, ready=True))
    cold, after = outcomes[4].snapshot.verdicts.last, outcomes[-1].snapshot.verdicts.last

    assert [p.bound.value for p in cold] == ["disk"]  # the cold start read 1 GiB/s
    assert outcomes[-1].finished is not None  # the lifecycle timed it: 0.4 s
    (own,) = after
    assert (own.figures.phase, own.bound.value) == (Phase.STARTING, "page_cache")
    assert own.figures.seconds == pytest.approx(0.4)
    assert own.figures.read_bytes == 1 << 20
    assert "the weights came from the page cache: a warm start" in own.advice


def test_a_start_that_left_no_readings_shows_no_bounds_rather_than_the_previous_ones():
    # Started and exited between two ticks: only its pid and start time were sampled.
    gone = ProcessSample(20, T0 + 5.6, (20,), 0, 0.0, None, zombie=True)
    outcomes = _run(_restarted(gone, ready=False))

    assert outcomes[4].snapshot.verdicts.last
    assert outcomes[-1].snapshot.state.phase is Phase.FAILED
    assert outcomes[-1].finished is not None
    assert outcomes[-1].snapshot.verdicts.last == ()


def test_a_start_seen_ready_before_its_tree_was_found_is_timed_as_the_lifecycle_timed_it():
    # The probe answers a tick before the scan finds the tree (real llama.cpp, tiny model).
    tree = ProcessSample(20, T0 + 0.8, (20,), 2 * GIB, 0.3, 1 << 20)
    outcomes = _run(
        [
            TargetReadings(probe=_probe(False, T0)),
            TargetReadings(probe=_probe(True, T0 + 1)),
            TargetReadings(process=tree, probe=_probe(True, T0 + 2)),
        ]
    )
    finished = outcomes[-1].finished
    assert finished is not None
    (own,) = outcomes[-1].snapshot.verdicts.last
    assert own.figures.seconds == pytest.approx(finished.duration_seconds)  # 0.2 s, not 1.2
