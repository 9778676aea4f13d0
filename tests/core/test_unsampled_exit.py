"""A new process gone at its first sample (issue 33): a failed start, timed, not a plain down."""

from __future__ import annotations

from dataclasses import replace

from exporter.base.model import FailureReason, LogClass, Phase
from tests.core.test_lifecycle import OK, T0, line, proc, run_trace


def _gone(pid, start):
    return proc(pid=pid, start=start, zombie=True)


def test_a_restart_gone_before_any_tick_saw_it_alive_fails_with_its_duration():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (1, dict(process=None, health=None)),  # killed
            (2, dict(process=_gone(200, T0 + 1.5), health=None)),  # back and dead already
            (3, dict(process=None, health=None)),  # reaped
        ]
    )
    assert [s.phase for s in states] == [Phase.READY, Phase.DOWN, Phase.FAILED, Phase.FAILED]
    failed = states[2]
    assert failed.reason == "process exited before its first sample"
    assert failed.failure_reason is FailureReason.EXITED
    assert failed.finished_start is not None and failed.last_cold_start == failed.finished_start
    assert failed.finished_start.outcome == "failed"
    assert abs(failed.finished_start.duration_seconds - 0.5) < 1e-6
    assert failed.counters.start_failures == ((FailureReason.EXITED, 1),)
    assert failed.counters.cold_starts.count == 0  # the histogram times starts that got ready
    assert states[3].finished_start is None  # counted once


def test_a_replacement_of_a_ready_process_gone_at_once_fails_too():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (2, dict(process=_gone(300, T0 + 1.0), health=None)),
        ]
    )
    final = states[-1]
    assert (final.phase, final.counters.restarts) == (Phase.FAILED, 1)
    assert final.last_cold_start is not None and final.last_cold_start.outcome == "failed"


def test_a_dead_process_the_first_tick_finds_is_no_failed_start():
    # Its start was not watched: it may have ended long before the exporter began.
    final = run_trace([(0, dict(process=_gone(100, T0 - 0.2), health=None))])[-1]
    assert final.phase is Phase.DOWN
    assert final.last_cold_start is None


def _fatal(at):
    return replace(
        line("failed to load model", LogClass.FATAL, fatal_reason=FailureReason.CRASH), at=at
    )


def test_a_start_only_its_log_saw_fails_as_a_new_start_timed_from_its_first_line():
    # llama-server with a missing model path: gone in 5 ms, never found, its lines read later.
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (1, dict(process=None, health=None)),  # stopped
            (2, dict(process=None, health=None)),
            (3, dict(process=None, health=None, log_events=(_fatal(T0 + 2.4),))),
        ]
    )
    final = states[-1]
    assert final.phase is Phase.FAILED and final.failure_reason is FailureReason.CRASH
    assert final.create_time == T0 + 2.4  # /status started_at: after wait's --started-after
    assert final.last_cold_start is not None and final.last_cold_start.outcome == "failed"
    assert abs(final.last_cold_start.duration_seconds - 0.6) < 1e-6


def test_a_dead_servers_last_lines_read_the_tick_after_its_death_stay_its_own():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (1, dict(process=None, health=None)),  # died
            (2, dict(process=None, health=None, log_events=(_fatal(T0 + 0.9),))),
        ]
    )
    final = states[-1]
    assert final.phase is Phase.FAILED
    assert final.create_time == T0 - 3600
    assert final.last_cold_start is None


def _loading(at):
    return replace(line("srv    load_model: loading model '/m.gguf'", phase=Phase.LOADING), at=at)


def test_a_restart_that_fails_unseen_in_the_tick_that_saw_the_server_go_is_a_failed_start():
    # systemctl restart onto a missing model path: within one tick the ready server stops and
    # the new llama-server logs its load and its failure and is gone (real llama.cpp, 0.5 s).
    last_words = replace(line("cleaning up before exit..."), at=T0 + 1.1)
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (1, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (2, dict(process=None, health=None,
                     log_events=(last_words, _loading(T0 + 1.2), _fatal(T0 + 1.2)))),
        ]
    )  # fmt: skip
    final = states[-1]
    assert [(t.from_phase, t.to_phase) for t in final.transitions][-3:] == [
        (Phase.READY, Phase.DOWN),
        (Phase.DOWN, Phase.LOADING),
        (Phase.LOADING, Phase.FAILED),
    ]
    assert final.transitions[-3].reason == "process exited"  # the fatal line is not its own
    assert final.phase is Phase.FAILED and final.failure_reason is FailureReason.CRASH
    assert final.create_time == T0 + 1.2  # /status started_at: after wait's --started-after
    assert final.last_cold_start is not None and final.last_cold_start.outcome == "failed"
    assert abs(final.last_cold_start.duration_seconds - 0.8) < 1e-6
    assert final.counters.deaths == ((FailureReason.EXITED, 1),)
    assert final.counters.start_failures == ((FailureReason.CRASH, 1),)


def test_a_start_with_its_own_load_line_the_tick_after_a_death_is_a_new_failed_start():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (1, dict(process=None, health=None)),  # stopped
            (2, dict(process=None, health=None, log_events=(_loading(T0 + 1.3), _fatal(T0 + 1.3)))),
        ]
    )
    final = states[-1]
    assert final.phase is Phase.FAILED and final.create_time == T0 + 1.3
    assert final.last_cold_start is not None and final.last_cold_start.outcome == "failed"


def test_a_server_that_crashes_while_up_with_no_load_line_still_dies_of_its_fatal_line():
    states = run_trace(
        [
            (0, dict(process=proc(pid=100, start=T0 - 3600), health=OK)),
            (1, dict(process=None, health=None, log_events=(_fatal(T0 + 0.9),))),
        ]
    )
    final = states[-1]
    assert final.phase is Phase.DOWN and final.last_cold_start is None
    assert final.reason == "process exited after a fatal log line: crash"
