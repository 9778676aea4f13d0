"""Traces of (observation, now) through the pure core: no sleeps, no clock patching."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.base.model import (
    STARTUP_PHASES,
    EngineReport,
    FailureReason,
    LogClass,
    LogEvent,
    ModelState,
    Observation,
    Phase,
    ProbeKind,
    ProbeOutcome,
    ProbeResult,
    ProcessSample,
)
from exporter.core.lifecycle import (
    COLD_START_BUCKETS,
    DEFAULT_STALL_SECONDS,
    STALL_FLOOR_SECONDS,
    TRANSITIONS,
    TargetState,
    Thresholds,
    initial_state,
    learned_stall_seconds,
    phase_durations_total,
    step,
)

T0 = 1_700_000_000.0
GiB = 2**30


def proc(pid=100, start=T0, rss=GiB, cpu=1.0, read=0, n=2, zombie=False):
    return ProcessSample(
        pid=pid,
        create_time=start,
        pids=tuple(range(pid, pid + n)),
        rss_bytes=rss,
        cpu_seconds=cpu,
        read_bytes=read,
        zombie=zombie,
    )


def health(outcome=ProbeOutcome.REFUSED, status=None, at=T0, loading=False):
    return ProbeResult(ProbeKind.HEALTH, outcome, status, 0.001, at, loading=loading)


OK = health(ProbeOutcome.OK, 200)
REFUSED = health()


def completion(ok=True):
    outcome = ProbeOutcome.OK if ok else ProbeOutcome.BAD_BODY
    return ProbeResult(ProbeKind.COMPLETION, outcome, 200, 0.01, T0, has_choices=ok)


def line(text, cls=LogClass.INFO, **kw):
    return LogEvent(cls=cls, text=text, at=T0, **kw)


def run_trace(trace, th=None, state=None):
    """Feed (seconds after T0, Observation kwargs) pairs; return every state."""
    th = th or Thresholds()
    state = state or initial_state("t")
    states = []
    for offset, kw in trace:
        now = T0 + offset
        state = step(state, Observation(target="t", at=now, **kw), now, th)
        states.append(state)
    return states


def phases(states):
    out = []
    for s in states:
        if not out or out[-1] != s.phase:
            out.append(s.phase)
    return out


def healthy_start():
    """A cold start: refused while loading (reads, GPU memory climbing), then healthy."""
    trace = [(0, dict(health=REFUSED))]
    for i in range(1, 6):
        trace.append(
            (
                i,
                dict(
                    process=proc(read=i * GiB, cpu=i), health=REFUSED, gpu_memory_bytes=i * 10 * GiB
                ),
            )
        )
    trace.append(
        (
            6,
            dict(
                process=proc(read=5 * GiB, cpu=9),
                health=REFUSED,
                gpu_memory_bytes=50 * GiB,
                log_events=(line("KV cache", LogClass.MARKER, phase=Phase.INITIALIZING),),
            ),
        )
    )
    trace.append(
        (8, dict(process=proc(read=5 * GiB, cpu=12), health=OK, gpu_memory_bytes=70 * GiB))
    )
    trace.append(
        (
            9,
            dict(
                process=proc(read=5 * GiB, cpu=13),
                health=OK,
                completion=completion(),
                gpu_memory_bytes=70 * GiB,
            ),
        )
    )
    return trace


def test_healthy_cold_start_goes_through_every_phase_and_is_timed_from_process_start():
    states = run_trace(healthy_start())
    assert phases(states) == [
        Phase.DOWN,
        Phase.STARTING,
        Phase.LOADING,
        Phase.INITIALIZING,
        Phase.READY,
        Phase.SERVING,
    ]
    final = states[-1]
    assert final.counters.cold_starts.count == 1
    # measured from create_time (T0), not from when the exporter first saw the process
    assert final.last_cold_start is not None
    assert final.last_cold_start.duration_seconds == pytest.approx(8.0)
    assert phase_durations_total(final) == pytest.approx(8.0)
    assert not any(s.stalled for s in states)


def test_connection_refused_with_a_live_process_is_starting_not_down():
    states = run_trace(
        [(0, dict(process=proc(), health=REFUSED)), (1, dict(process=proc(), health=REFUSED))]
    )
    assert states[-1].phase is Phase.STARTING


def test_no_process_and_refused_is_down():
    states = run_trace([(0, dict(health=REFUSED))])
    assert states[-1].phase is Phase.DOWN
    assert "refused" in states[-1].reason


def test_llamacpp_503_loading_model_is_loading():
    states = run_trace(
        [(0, dict(process=proc(), health=health(ProbeOutcome.HTTP_STATUS, 503, loading=True)))]
    )
    assert states[-1].phase is Phase.LOADING


def test_process_exit_during_load_is_failed_exited_and_counted():
    trace = healthy_start()[:3] + [(3, dict(health=REFUSED))]
    final = run_trace(trace)[-1]
    assert final.phase is Phase.FAILED
    assert final.failure_reason is FailureReason.EXITED
    assert dict(final.counters.start_failures) == {FailureReason.EXITED: 1}
    assert final.last_cold_start is not None and final.last_cold_start.outcome == "failed"


def test_fatal_log_line_fails_the_start_with_its_reason_even_before_exit():
    oom = line(
        "torch.OutOfMemoryError: CUDA out of memory", LogClass.FATAL, fatal_reason=FailureReason.OOM
    )
    trace = healthy_start()[:3] + [
        (3, dict(process=proc(read=3 * GiB), health=REFUSED, log_events=(oom,)))
    ]
    final = run_trace(trace)[-1]
    assert final.phase is Phase.FAILED
    assert final.failure_reason is FailureReason.OOM
    assert final.notable_lines[-1].text.startswith("torch.OutOfMemoryError")


def test_stop_of_a_ready_server_is_down_not_failure():
    trace = healthy_start() + [(20, dict(health=REFUSED))]
    final = run_trace(trace)[-1]
    assert final.phase is Phase.DOWN
    assert final.counters.start_failures == ()


def test_a_death_while_serving_is_counted_and_clears_what_the_process_made_true():
    # Issue 30 #2: a SIGKILL while serving went down with no counter, progress 100 % and the
    # last completion (probe_success 1) kept.
    serving = run_trace(healthy_start())[-1]
    assert serving.phase is Phase.SERVING and serving.progress_ratio == 1.0
    down = run_trace([(20, dict(health=REFUSED))], state=serving)[-1]
    assert down.phase is Phase.DOWN and down.phase_since == T0 + 20
    assert down.reason == "process exited"
    assert down.counters.deaths == ((FailureReason.EXITED, 1),)
    assert down.counters.start_failures == ()
    assert down.progress_ratio is None and down.eta_seconds is None
    assert down.last_completion is None
    # a completion in flight at the kill, answered in the tick the process is gone
    raced = run_trace([(20, dict(health=REFUSED, completion=completion()))], state=serving)[-1]
    assert raced.phase is Phase.DOWN and raced.last_completion is None


def test_an_oom_line_before_the_death_is_its_cause():
    serving = run_trace(healthy_start())[-1]
    oom = line(
        "torch.OutOfMemoryError: CUDA out of memory.",
        LogClass.FATAL,
        fatal_reason=FailureReason.OOM,
    )
    alive = dict(process=proc(read=5 * GiB, cpu=14), health=OK, gpu_memory_bytes=70 * GiB)
    states = run_trace(
        [(10, {**alive, "log_events": (oom,)}), (12, dict(health=REFUSED))], state=serving
    )
    assert states[0].phase is Phase.SERVING, "a fatal line alone does not end a serving server"
    down = states[-1]
    assert down.reason == "process exited after a fatal log line: oom"
    assert down.counters.deaths == ((FailureReason.OOM, 1),)
    assert down.reason_detail is not None and "CUDA out of memory" in down.reason_detail
    later = run_trace([(20, dict(health=REFUSED))], state=down)[-1]
    assert later.reason == down.reason, "how it died stands while it stays down"
    restarted = run_trace(healthy_start(), state=replace(down, updated_at=None))[-1]
    again = run_trace([(30, dict(health=REFUSED))], state=restarted)[-1]
    assert dict(again.counters.deaths) == {FailureReason.OOM: 1, FailureReason.EXITED: 1}


def test_flapping_health_after_ready_is_degraded_then_recovers():
    failing = health(ProbeOutcome.HTTP_STATUS, 503)
    trace = healthy_start() + [
        (10, dict(process=proc(cpu=13), health=failing)),
        (11, dict(process=proc(cpu=13), health=failing)),
    ]
    states = run_trace(trace)
    assert states[-2].phase is Phase.SERVING  # one failure is tolerated
    assert states[-1].phase is Phase.DEGRADED
    recovered = run_trace([(12, dict(process=proc(cpu=13), health=OK))], state=states[-1])
    assert recovered[-1].phase is Phase.READY


def test_silence_beyond_the_threshold_raises_stall_and_names_the_quiet_evidence():
    th = Thresholds(stall_seconds={Phase.STARTING: 30, Phase.LOADING: 30, Phase.INITIALIZING: 30})
    trace = healthy_start()[:4]
    trace += [
        (t, dict(process=proc(read=3 * GiB, cpu=3), health=REFUSED, gpu_memory_bytes=30 * GiB))
        for t in range(4, 40, 2)
    ]
    states = run_trace(trace, th)
    stalled_at = [T0 + t for (t, _), s in zip(trace, states, strict=True) if s.stalled]
    assert stalled_at, "a 36 s silence with a 30 s threshold must stall"
    assert stalled_at[0] - T0 <= 3 + 30 + 2
    assert "quiet" in (states[-1].stall_reason or "")
    assert states[-1].phase is Phase.LOADING


def test_slow_load_with_only_disk_reads_never_stalls():
    th = Thresholds(stall_seconds={Phase.STARTING: 30, Phase.LOADING: 30, Phase.INITIALIZING: 30})
    trace = [
        (t, dict(process=proc(read=t * 2**20, cpu=1.0), health=REFUSED)) for t in range(0, 300, 5)
    ]
    states = run_trace(trace, th)
    assert not any(s.stalled for s in states)


def test_warm_page_cache_load_progresses_on_gpu_memory_alone():
    th = Thresholds(stall_seconds={Phase.STARTING: 30, Phase.LOADING: 30, Phase.INITIALIZING: 30})
    trace = [
        (t, dict(process=proc(read=0, cpu=1.0), health=REFUSED, gpu_memory_bytes=t * GiB))
        for t in range(0, 120, 5)
    ]
    states = run_trace(trace, th)
    assert states[-1].phase is Phase.LOADING
    assert not any(s.stalled for s in states)


def test_gpu_utilisation_alone_is_not_progress():
    # NCCL hang: nothing moves; utilisation is not even an input of the core.
    th = Thresholds(stall_seconds={Phase.STARTING: 10, Phase.LOADING: 10, Phase.INITIALIZING: 10})
    trace = [
        (t, dict(process=proc(read=GiB, cpu=1.0), health=REFUSED, gpu_memory_bytes=40 * GiB))
        for t in range(0, 30, 2)
    ]
    assert run_trace(trace, th)[-1].stalled


def test_shard_progress_aggregates_ranks_and_never_regresses_when_a_draft_loads():
    def bar(done, total, key="shards"):
        return line(
            f"Loading safetensors checkpoint shards: {done}/{total}",
            LogClass.PROGRESS,
            progress=(done, total),
            progress_key=key,
        )

    trace = [
        (0, dict(process=proc(), health=REFUSED, log_events=(bar(10, 64), bar(8, 64)))),
        (1, dict(process=proc(), health=REFUSED, log_events=(bar(32, 64),))),
        (2, dict(process=proc(), health=REFUSED, log_events=(bar(64, 64),))),
        (3, dict(process=proc(), health=REFUSED, log_events=(bar(1, 4, "draft:shards"),))),
    ]
    ratios = [s.progress_ratio for s in run_trace(trace)]
    assert ratios[0] == pytest.approx(10 / 64)
    assert ratios[1] == pytest.approx(0.5)
    assert ratios == sorted(ratios)


def test_progress_from_bytes_read_over_weights_size_and_an_eta():
    th = Thresholds(weights_bytes=200 * GiB)
    trace = [(t, dict(process=proc(read=t * 10 * GiB), health=REFUSED)) for t in range(11)]
    final = run_trace(trace, th)[-1]
    assert final.phase is Phase.LOADING
    assert final.progress_ratio == pytest.approx(0.5)
    # about 9 s of loading got half-way: roughly as long again remains
    assert final.eta_seconds is not None and 5 < final.eta_seconds < 15


def test_reads_of_an_engine_importing_its_libraries_are_not_loading():
    # vLLM from a cold page cache: torch and CUDA libraries read GBs before any weight
    th = Thresholds(weights_bytes=2 * 2**20)
    trace = [(t, dict(process=proc(read=t * 2**30 // 2), health=REFUSED)) for t in range(7)]
    final = run_trace(trace, th)[-1]
    assert final.phase is Phase.STARTING
    assert final.progress_ratio is None


def test_progress_and_eta_are_absent_when_unknown():
    final = run_trace([(0, dict(process=proc(), health=REFUSED))])[-1]
    assert final.progress_ratio is None
    assert final.eta_seconds is None


def test_new_process_is_a_new_cold_start_and_a_restart():
    trace = healthy_start() + [(30, dict(process=proc(pid=200, start=T0 + 29), health=REFUSED))]
    final = run_trace(trace)[-1]
    assert final.counters.restarts == 1
    assert final.phase is Phase.STARTING
    assert final.create_time == T0 + 29


def test_pid_reuse_with_a_new_create_time_is_a_new_instance():
    trace = healthy_start()[:3] + [(3, dict(process=proc(start=T0 + 2.5), health=REFUSED))]
    final = run_trace(trace)[-1]
    assert final.counters.restarts == 1
    assert dict(final.counters.start_failures) == {FailureReason.EXITED: 1}


def test_log_ready_marker_stands_in_for_the_probe_only_when_no_probe_runs():
    ready = line("The server is fired up and ready to roll!", LogClass.MARKER, phase=Phase.READY)
    no_probe = run_trace([(0, dict(process=proc(), log_events=(ready,)))])
    assert no_probe[-1].phase is Phase.READY
    probing = run_trace([(0, dict(process=proc(), health=REFUSED, log_events=(ready,)))])
    assert probing[-1].phase is not Phase.READY


def test_exporter_started_after_the_server_was_ready_records_no_cold_start():
    final = run_trace([(0, dict(process=proc(start=T0 - 86400), health=OK))])[-1]
    assert final.phase is Phase.READY
    assert final.counters.cold_starts.count == 0


def test_learned_stall_threshold_follows_history_with_a_floor():
    assert learned_stall_seconds(None, None, Phase.LOADING) == DEFAULT_STALL_SECONDS[Phase.LOADING]
    assert learned_stall_seconds(600.0, None, Phase.INITIALIZING) == 1200.0
    assert learned_stall_seconds(1.0, None, Phase.LOADING) == STALL_FLOOR_SECONDS
    assert learned_stall_seconds(600.0, 45.0, Phase.LOADING) == 45.0


def test_cold_start_histogram_buckets_the_duration():
    final = run_trace(healthy_start())[-1]
    counts = final.counters.cold_starts.bucket_counts
    assert len(counts) == len(COLD_START_BUCKETS) + 1
    assert counts[0] == 1  # 8 s falls in the first bucket (<= 15 s)


# --- properties -----------------------------------------------------------------------------

probes = st.sampled_from(
    [
        None,
        OK,
        REFUSED,
        health(ProbeOutcome.TIMEOUT),
        health(ProbeOutcome.HTTP_STATUS, 503),
        health(ProbeOutcome.HTTP_STATUS, 503, loading=True),
    ]
)
events = st.lists(
    st.sampled_from(
        [
            line("noise", LogClass.BENIGN),
            line("x", LogClass.MARKER, phase=Phase.LOADING),
            line("y", LogClass.MARKER, phase=Phase.INITIALIZING),
            line("z", LogClass.MARKER, phase=Phase.READY),
            line("bar", LogClass.PROGRESS, progress=(3, 8), progress_key="shards"),
            line("bar", LogClass.PROGRESS, progress=(8, 8), progress_key="shards"),
            line("oom", LogClass.FATAL, fatal_reason=FailureReason.OOM),
        ]
    ),
    max_size=3,
).map(tuple)
processes = st.one_of(
    st.none(),
    st.builds(
        proc,
        pid=st.sampled_from([100, 200]),
        start=st.sampled_from([T0, T0 + 1]),
        rss=st.integers(0, 2**40),
        cpu=st.floats(0, 1e5),
        read=st.integers(0, 2**40),
        n=st.integers(1, 70),
        zombie=st.booleans(),
    ),
)
ticks = st.lists(
    st.tuples(
        st.floats(0.1, 120),
        processes,
        probes,
        events,
        st.one_of(st.none(), st.integers(0, 2**37)),
        st.sampled_from([None, completion(True), completion(False)]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ticks)
def test_invariants_hold_on_arbitrary_observation_sequences(seq):
    state, now, th = initial_state("t"), T0, Thresholds(weights_bytes=10 * GiB)
    ready_seen = False
    start_key = None
    last_ratio: float | None = None
    for dt, p, h, evs, gpu, comp in seq:
        now += dt
        prev = state
        state = step(
            state,
            Observation(
                "t", now, process=p, health=h, log_events=evs, gpu_memory_bytes=gpu, completion=comp
            ),
            now,
            th,
        )
        if state.phase is not prev.phase:
            assert state.phase in TRANSITIONS[prev.phase] or (state.pid, state.create_time) != (
                prev.pid,
                prev.create_time,
            )
        key = (state.pid, state.create_time)
        if key != start_key:
            start_key, last_ratio, ready_seen = key, None, False
        if state.phase in (Phase.DOWN, Phase.FAILED):
            # The start ended: a process found again after it was gone (a pidfile missing for
            # a tick, the same pid and start time) begins a new one, its progress afresh.
            last_ratio = None
        if state.ready:
            ready_seen = True
        if state.phase is Phase.SERVING:
            assert ready_seen or prev.ready, "serving never before ready"
        if state.stalled:
            assert state.phase in STARTUP_PHASES
        if state.phase in STARTUP_PHASES and state.progress_ratio is not None:
            assert last_ratio is None or state.progress_ratio >= last_ratio
            last_ratio = state.progress_ratio
        if state.finished_start is not None and state.finished_start.outcome == "ready":
            total = sum(s for _, s in state.finished_start.phase_seconds)
            assert total == pytest.approx(state.finished_start.duration_seconds, abs=1e-6)


def test_state_is_immutable_and_step_is_deterministic():
    a = run_trace(healthy_start())
    b = run_trace(healthy_start())
    assert a == b
    with pytest.raises(AttributeError):
        a[-1].phase = Phase.DOWN  # type: ignore[misc]
    assert isinstance(replace(a[-1]), TargetState)


def test_a_fatal_line_outlives_the_traceback_frames_printed_after_it():
    fatal = line(
        "torch.OutOfMemoryError: CUDA out of memory", LogClass.FATAL, fatal_reason=FailureReason.OOM
    )
    frames = tuple(line(f'  File "x.py", line {i}', LogClass.ERROR) for i in range(30))
    final = run_trace([(0, dict(process=proc(), health=REFUSED, log_events=(fatal, *frames)))])[-1]
    assert len(final.notable_lines) == 10
    assert final.notable_lines[0] is fatal


def test_a_phase_announced_with_the_fatal_line_stays_in_the_timeline():
    init = line("KV Cache is allocated.", LogClass.MARKER, phase=Phase.INITIALIZING)
    oom = line(
        "torch.OutOfMemoryError: CUDA out of memory", LogClass.FATAL, fatal_reason=FailureReason.OOM
    )
    trace = [
        *healthy_start()[:3],
        (3, dict(process=proc(read=3 * GiB), health=REFUSED, log_events=(init, oom))),
    ]
    final = run_trace(trace)[-1]
    assert [t.to_phase for t in final.transitions][-2:] == [Phase.INITIALIZING, Phase.FAILED]
    assert final.failure_reason is FailureReason.OOM


def test_a_stalled_start_has_no_eta():
    th = Thresholds(
        weights_bytes=200 * GiB,
        stall_seconds={Phase.STARTING: 30, Phase.LOADING: 30, Phase.INITIALIZING: 30},
    )
    trace = [(t, dict(process=proc(read=t * 10 * GiB), health=REFUSED)) for t in range(11)]
    trace += [(t, dict(process=proc(read=100 * GiB), health=REFUSED)) for t in range(12, 60, 4)]
    states = run_trace(trace, th)
    assert states[10].eta_seconds is not None
    assert states[-1].stalled and states[-1].eta_seconds is None


# --- sleep mode ---------------------------------------------------------------------------


ASLEEP = replace(OK, sleeping=True)
AWAKE = replace(OK, sleeping=False)


def test_sleep_and_wake_are_neither_down_nor_a_cold_start():
    p = proc()
    gpu = {"gpu_memory_bytes": 60 * GiB}
    trace = [
        (0, {"process": p, "health": REFUSED}),
        (30, {"process": p, "health": AWAKE, **gpu}),
        (40, {"process": p, "health": ASLEEP, "gpu_memory_bytes": 2 * GiB}),
        (100, {"process": p, "health": ASLEEP, "gpu_memory_bytes": 2 * GiB}),
        (101, {"process": p, "health": ASLEEP, "gpu_memory_bytes": 30 * GiB}),  # waking
        (103, {"process": p, "health": AWAKE, **gpu}),
    ]
    states = run_trace(trace)
    ready, asleep, still, waking, woken = states[1:]
    assert ready.phase is Phase.READY and ready.counters.cold_starts.count == 1
    assert asleep.phase is still.phase is waking.phase is Phase.SLEEPING
    assert not still.stalled and still.failure_reason is None and not still.ready
    assert woken.phase is Phase.READY and woken.finished_start is None
    assert woken.last_wake is not None
    assert woken.last_wake.duration_seconds == pytest.approx(3.0)  # from the climb's tick before
    assert woken.counters.wakes.count == 1 and woken.counters.cold_starts.count == 1
    assert woken.counters.restarts == 0


def test_a_wake_too_quick_to_see_climb_is_counted_from_the_last_asleep_tick():
    p = proc()
    states = run_trace(
        [
            (0, {"process": p, "health": REFUSED}),
            (30, {"process": p, "health": AWAKE}),
            (40, {"process": p, "health": ASLEEP}),
            (41, {"process": p, "health": AWAKE}),
        ]
    )
    assert states[-1].last_wake is not None
    assert states[-1].last_wake.duration_seconds == pytest.approx(1.0)


def test_an_engine_that_stops_saying_keeps_sleeping_and_one_that_fails_is_degraded():
    p = proc()
    unknown = replace(OK, sleeping=None)
    failing = health(ProbeOutcome.HTTP_STATUS, 500)
    states = run_trace(
        [
            (0, {"process": p, "health": REFUSED}),
            (30, {"process": p, "health": AWAKE}),
            (40, {"process": p, "health": ASLEEP}),
            (41, {"process": p, "health": unknown}),
            (42, {"process": p, "health": failing}),
            (43, {"process": p, "health": failing}),
            (44, {"process": p, "health": failing}),
        ]
    )
    assert states[3].phase is Phase.SLEEPING
    assert states[-1].phase is Phase.DEGRADED


def test_sleeping_before_the_first_ready_is_not_believed():
    """A server never seen ready cannot be asleep: it is starting, and ready when it answers."""
    p = proc()
    states = run_trace(
        [(0, {"process": p, "health": REFUSED}), (5, {"process": p, "health": ASLEEP})]
    )
    assert states[-1].phase is Phase.READY


def test_the_loader_a_start_names_is_kept_with_its_throughput_until_the_next_instance():
    bar = line(
        "Loading safetensors using Runai Model Streamer: 43% Completed | 3/7",
        cls=LogClass.PROGRESS,
        progress=(3, 7),
        phase=Phase.LOADING,
        loader="runai-streamer",
    )
    summary = line(
        "Overall time to stream 34.3 GiB: 28.52s, 1.2 GiB/s",
        loader="runai-streamer",
        loader_bytes_per_second=1.2 * GiB,
    )
    states = run_trace(
        [
            (0, {"process": proc(), "health": REFUSED}),
            (5, {"process": proc(), "health": REFUSED, "log_events": (bar,)}),
            (9, {"process": proc(), "health": REFUSED, "log_events": (summary,)}),
            (12, {"process": proc(), "health": REFUSED, "log_events": (line("compiling"),)}),
            (20, {"process": proc(pid=200, start=T0 + 19), "health": REFUSED}),
        ]
    )
    assert (states[1].loader, states[1].loader_bytes_per_second) == ("runai-streamer", None)
    assert states[3].loader == "runai-streamer"
    assert states[3].loader_bytes_per_second == pytest.approx(1.2 * GiB)
    assert states[1].phase is Phase.LOADING
    assert (states[4].loader, states[4].loader_bytes_per_second) == (None, None)


def test_a_model_the_server_gave_up_on_fails_the_start_naming_it_and_why():
    bad = ModelState("mistral", "1", "UNAVAILABLE", "load failed: CUDA out of memory")
    waiting = ModelState("later", "1", "UNAVAILABLE", "unloaded")
    good = ModelState("llama", "1", "READY")
    not_ready = health(ProbeOutcome.HTTP_STATUS, 400)
    p = proc()
    states = run_trace(
        [
            (0, {"process": p, "health": REFUSED}),
            (
                5,
                {
                    "process": p,
                    "health": replace(not_ready, report=EngineReport(models=(good, waiting))),
                },
            ),
            (
                9,
                {
                    "process": p,
                    "health": replace(not_ready, report=EngineReport(models=(good, bad))),
                },
            ),
        ]
    )
    assert states[1].phase in STARTUP_PHASES  # a model not asked for yet is no failure
    failed = states[2]
    assert failed.phase is Phase.FAILED and failed.failure_reason is FailureReason.CRASH
    assert failed.reason == "model mistral failed to load"
    assert failed.reason_detail == "model mistral (version 1): load failed: CUDA out of memory"
    assert failed.engine_report is not None and len(failed.engine_report.models) == 2


def test_a_critical_gpu_error_fails_the_start_with_the_event_as_detail():
    xid = "Xid 79 on GPU 0 (GPU has fallen off the bus)"
    trace = healthy_start()[:3] + [
        (3, dict(process=proc(read=3 * GiB), health=REFUSED, gpu_errors=(xid,)))
    ]
    final = run_trace(trace)[-1]
    assert final.phase is Phase.FAILED
    assert final.failure_reason is FailureReason.GPU_ERROR
    assert final.reason_detail == xid
    assert dict(final.counters.start_failures) == {FailureReason.GPU_ERROR: 1}


def test_a_gpu_error_while_serving_leaves_the_verdict_to_the_health_probe():
    # A contained error may kill nothing the server needs: only failing probes degrade it.
    trace = healthy_start() + [(20, dict(process=proc(), health=OK, gpu_errors=("Xid 94",)))]
    final = run_trace(trace)[-1]
    assert final.phase in (Phase.READY, Phase.SERVING)
    assert final.failure_reason is None
