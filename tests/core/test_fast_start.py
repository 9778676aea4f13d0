"""Starts over between two ticks (issue 33): a new process ready at its first sample is timed."""

from __future__ import annotations

from exporter.base.model import FailureReason, Phase
from exporter.core.lifecycle import initial_state
from tests.core.test_lifecycle import OK, REFUSED, T0, proc, run_trace


def test_a_restart_ready_before_any_tick_saw_it_starting_is_a_timed_cold_start():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),  # up before we began
            (1, dict(process=None, health=None)),  # killed
            (2, dict(process=proc(pid=200, start=T0 + 1.4), health=OK)),  # back, already ready
        ]
    )
    assert [s.phase for s in states] == [Phase.READY, Phase.DOWN, Phase.READY]
    final = states[-1]
    assert final.counters.cold_starts.count == 1
    assert final.last_cold_start is not None
    assert final.last_cold_start.started_at == T0 + 1.4
    assert abs(final.last_cold_start.duration_seconds - 0.6) < 1e-6
    assert dict(final.phase_seconds) == {Phase.STARTING: final.last_cold_start.duration_seconds}


def test_a_process_replaced_while_ready_by_one_ready_at_once_is_counted_too():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (1, dict(process=proc(pid=300, start=T0 + 0.5), health=OK)),
        ]
    )
    final = states[-1]
    assert (final.phase, final.counters.restarts) == (Phase.READY, 1)
    assert final.counters.cold_starts.count == 1


def test_every_one_of_back_to_back_restarts_counts_with_its_duration():
    trace = [(0.0, dict(process=proc(pid=100, start=T0 - 60), health=OK))]
    for i in range(1, 7):  # killed and restarted six times, each ready within the tick
        trace.append(
            (2.0 * i, dict(process=proc(pid=100 + i, start=T0 + 2.0 * i - 0.3), health=OK))
        )
    states = run_trace(trace)
    durations = [s.finished_start.duration_seconds for s in states if s.finished_start]
    assert len(durations) == 6
    assert all(abs(d - 0.3) < 1e-6 for d in durations)
    assert states[-1].counters.cold_starts.count == 6


def test_a_ready_process_the_first_tick_finds_is_still_no_cold_start():
    # Started a moment before the exporter: its start was not watched, so it is not timed.
    final = run_trace([(0, dict(process=proc(start=T0 - 0.2), health=OK))])[-1]
    assert final.phase is Phase.READY
    assert final.counters.cold_starts.count == 0
    assert final.last_cold_start is None


def test_a_process_that_started_before_the_first_tick_is_not_taken_for_a_fresh_one():
    # Found late, but it started before the exporter watched: its start was not watched.
    state = run_trace([(0, dict(process=None, health=None))], state=initial_state("t"))[-1]
    final = run_trace([(10, dict(process=proc(start=T0 - 30), health=OK))], state=state)[-1]
    assert final.phase is Phase.READY
    assert final.counters.cold_starts.count == 0


def test_a_process_found_a_tick_late_is_timed_from_its_own_start():
    # Its pid file was written after the tick that followed its start (Python imports first).
    states = run_trace(
        [
            (0, dict(process=None, health=None)),
            (2, dict(process=None, health=None)),
            (4, dict(process=proc(pid=500, start=T0 + 1.5), health=OK)),
        ]
    )
    final = states[-1]
    assert final.counters.cold_starts.count == 1
    assert final.last_cold_start is not None
    assert abs(final.last_cold_start.duration_seconds - 2.5) < 1e-6


def test_a_start_the_probe_saw_ready_before_the_scan_found_its_process_is_counted():
    # Real llama.cpp with a tiny model is ready 35 ms after it starts: between a tick's process
    # scan and its probe. Without a completion probe nothing moved it on, and it was lost.
    states = run_trace(
        [
            (0, dict(process=None, health=REFUSED)),
            (1, dict(process=None, health=OK)),
            (2, dict(process=proc(pid=200, start=T0 + 0.8), health=OK)),
            (3, dict(process=proc(pid=200, start=T0 + 0.8), health=OK)),
        ]
    )
    final = states[-1]
    assert final.counters.cold_starts.count == 1
    assert final.last_cold_start is not None and final.last_cold_start.started_at == T0 + 0.8
    assert final.last_cold_start.ended_at == T0 + 1  # the tick that saw it ready
    assert abs(final.last_cold_start.duration_seconds - 0.2) < 1e-6


def test_a_restart_seen_ready_before_its_process_counts_one_death_and_its_real_duration():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 60), health=OK)),
            (1, dict(process=None, health=REFUSED)),  # stopped
            (2, dict(process=None, health=OK)),  # the new one answers; the scan missed it
            (3, dict(process=proc(pid=200, start=T0 + 1.8), health=OK)),
        ]
    )
    final = states[-1]
    assert final.counters.deaths == ((FailureReason.EXITED, 1),)
    assert final.counters.restarts == 1
    assert [t.to_phase for t in final.transitions] == [Phase.READY, Phase.DOWN, Phase.READY]
    assert final.counters.cold_starts.count == 1
    assert final.last_cold_start is not None
    assert abs(final.last_cold_start.duration_seconds - 0.2) < 1e-6
