"""The step: (previous state, observation, now, thresholds) -> new state."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta, timezone

from exporter.base.model import STARTUP_PHASES, FailureReason, LogClass, Observation, Phase
from exporter.core.failure import reason_detail
from exporter.core.lifecycle.evidence import Evidence, gather_evidence, next_baseline
from exporter.core.lifecycle.phase import failed_model, next_phase
from exporter.core.lifecycle.progress import (
    estimate_eta,
    merge_shards,
    next_progress_ratio,
    note_loader,
    stall_verdict,
    track_download,
)
from exporter.core.lifecycle.state import (
    ORDER,
    TRANSITIONS,
    UP_PHASES,
    TargetState,
    Thresholds,
    Wake,
    evolve,
)
from exporter.core.lifecycle.tracking import (
    add_seconds,
    begin_instance,
    begin_unseen,
    count_lines,
    end_with,
    enter,
    new_instance,
    notable,
    record_death,
    track_load,
)


def step(prev: TargetState, obs: Observation, now: float, th: Thresholds) -> TargetState:
    """Advance one target's state by one observation taken at ``now`` (epoch seconds)."""
    run = _failed_run(obs)
    if run is not None and _gone(obs) and _ends_at(prev, run):
        # A server's end and a start that failed unseen came in one tick: the lines before
        # the start are the server's last, the start is judged on its own lines.
        prev = end_with(prev, obs.log_events[:run], now)
        obs = replace(obs, log_events=obs.log_events[run:])
    state = evolve(prev, finished_start=None)
    if new_instance(prev, obs):
        state = begin_instance(state, obs, now)
    dt = now - prev.updated_at if prev.updated_at is not None else 0.0
    ev = gather_evidence(state, obs, dt)
    phase, reason, failure = next_phase(state, obs, ev, now, th)
    state = evolve(
        state,
        shard_progress=merge_shards(state.shard_progress, obs.log_events),
        notable_lines=notable(state.notable_lines, obs.log_events),
        counters=count_lines(state.counters, obs.log_events, obs.log_tally),
    )
    if phase is Phase.FAILED and _logged_only(prev, state, obs):
        state = begin_unseen(state, _logged_start(prev, obs, now))
    if phase is Phase.FAILED and _passes_through(state.phase, ev.log_phase):
        # The same lines announced a later phase before the fatal one: keep it in the story.
        assert ev.log_phase is not None
        state = enter(state, ev.log_phase, f"log marker announces {ev.log_phase}", None, now)
    if ev.fatal_event is not None and state.phase in UP_PHASES:
        state = evolve(state, fatal_while_up=ev.fatal_event)
    if phase is Phase.DOWN and state.phase in UP_PHASES:
        state = record_death(state, now, reason)
    elif phase is not state.phase and phase in TRANSITIONS[state.phase]:
        state = enter(state, phase, reason, failure, now)
        if phase is Phase.FAILED:
            state = evolve(state, reason_detail=_failure_detail(ev, failure, obs, th))
    elif phase is state.phase and reason != state.reason:
        state = evolve(state, reason=reason)
    state = _track_wake(prev, _after_probe(track_load(state, obs), obs), ev, now)
    state = note_loader(track_download(state, obs, ev, dt), obs.log_events)
    if obs.health is not None and obs.health.report is not None:
        state = evolve(state, engine_report=obs.health.report)
    if ev.kinds and state.phase in STARTUP_PHASES:
        state = _note_progress(state, now, ev.kinds)
    elif state.phase in STARTUP_PHASES and state.last_progress_at is not None:
        quiet = now - state.last_progress_at
        state = evolve(
            state, longest_quiet=add_seconds(state.longest_quiet, state.phase, quiet, keep_max=True)
        )
    stalled, stall_reason = stall_verdict(state, now, th)
    ratio = next_progress_ratio(state, obs, th)
    # One state built for the tick's last fields (a step builds several; replay steps often).
    return evolve(
        state,
        stalled=stalled,
        stall_reason=stall_reason,
        updated_at=now,
        first_tick_at=prev.first_tick_at if prev.first_tick_at is not None else now,
        baseline=next_baseline(state.baseline, obs, ev, now),
        progress_ratio=ratio,
        eta_seconds=None if stalled else estimate_eta(state, now, th, ratio),
    )


def _failure_detail(
    ev: Evidence, failure: FailureReason | None, obs: Observation, th: Thresholds
) -> str | None:
    """For people: the GPU events, the decisive log line, or the model the server gave up on."""
    if failure is FailureReason.GPU_ERROR and obs.gpu_errors:
        return "; ".join(obs.gpu_errors)
    if failure is ev.fatal and ev.fatal_event is not None:
        zone = timezone(timedelta(seconds=th.utc_offset_seconds))
        return reason_detail(ev.fatal_event, zone)
    model = failed_model(obs)
    if model is not None:
        return f"model {model.name} (version {model.version or '-'}): {model.reason}"
    return None


def _logged_only(prev: TargetState, state: TargetState, obs: Observation) -> bool:
    """A failure while down that only the log saw: a new process the source never found.

    Not on the first tick (an old log), and not in the tick after a death was seen, the
    dead process's last lines may still be coming in, unless the lines show a start of
    their own (``_failed_run``).
    """
    return (
        state.phase is Phase.DOWN
        and _gone(obs)
        and prev.first_tick_at is not None
        and (
            prev.died_at is None or (prev.updated_at or 0.0) > prev.died_at or _failed_run(obs) == 0
        )
    )


def _failed_run(obs: Observation) -> int | None:
    """Where a start that failed begins in this tick's lines: a startup marker, then a fatal.

    A server that was up does not announce a startup phase again before it dies, so such
    lines after it are the next process's (``systemctl restart`` onto a missing model path:
    llama-server logs "loading model" and "failed to load model" within 5 ms and is gone
    before any sample). None when no startup marker comes before a fatal line.
    """
    begun: int | None = None
    for i, ev in enumerate(obs.log_events):
        if begun is None and ev.phase in STARTUP_PHASES:
            begun = i
        elif begun is not None and ev.cls is LogClass.FATAL and ev.fatal_reason is not None:
            return begun
    return None


def _ends_at(prev: TargetState, run: int) -> bool:
    """The previous server's story ends where the run begins.

    It was up, or it is down and the lines before the run are its last ones.
    """
    return prev.phase in UP_PHASES or (prev.phase is Phase.DOWN and run > 0)


def _gone(obs: Observation) -> bool:
    """The process source ran and found no process."""
    return obs.process is None and obs.process_error is None


def _logged_start(prev: TargetState, obs: Observation, now: float) -> float:
    """When a start seen only in the log began: its first line's time, after the last tick."""
    since = prev.updated_at if prev.updated_at is not None else now
    first = min((e.at for e in obs.log_events), default=now)
    return min(now, max(since, first))


def _passes_through(current: Phase, announced: Phase | None) -> bool:
    """A log marker moved the start forward (within the startup phases) in this tick."""
    return (
        announced in STARTUP_PHASES
        and current in (Phase.DOWN, *STARTUP_PHASES)
        and announced in TRANSITIONS[current]
        and ORDER[announced] > ORDER[current]
    )


def _track_wake(prev: TargetState, state: TargetState, ev: Evidence, now: float) -> TargetState:
    """A wake begins when GPU memory climbs in sleep and ends when the engine is awake again.

    Without a climb seen (a wake shorter than a tick), it began after the last tick that saw
    the server asleep. The wake goes to its own histogram, never to the cold-start one.
    """
    if state.phase is Phase.SLEEPING:
        if prev.phase is not Phase.SLEEPING:
            return evolve(state, wake_began_at=None)
        if ev.gpu_grew and state.wake_began_at is None:
            return evolve(state, wake_began_at=prev.updated_at or now)
        return state
    if prev.phase is not Phase.SLEEPING or state.phase not in (Phase.READY, Phase.SERVING):
        return evolve(state, wake_began_at=None) if state.wake_began_at is not None else state
    wake = Wake(state.wake_began_at or prev.updated_at or now, now)
    counters = replace(state.counters, wakes=state.counters.wakes.observe(wake.duration_seconds))
    return evolve(state, last_wake=wake, wake_began_at=None, counters=counters)


def _after_probe(state: TargetState, obs: Observation) -> TargetState:
    h = obs.health
    failures = 0 if h is None or h.ok else state.health_failures + 1
    # A completion probe runs beside the loop: one sent before a death can answer after it.
    # Only a server that is up keeps a completion result; a dead one shows none.
    up = state.phase in UP_PHASES
    return evolve(
        state,
        health_failures=failures,
        last_health=h if h is not None else state.last_health,
        last_completion=(obs.completion or state.last_completion) if up else None,
    )


def _note_progress(state: TargetState, now: float, kinds: tuple[str, ...]) -> TargetState:
    quiet = now - state.last_progress_at if state.last_progress_at is not None else 0.0
    return evolve(
        state,
        last_progress_at=now,
        last_evidence=", ".join(kinds),
        longest_quiet=add_seconds(state.longest_quiet, state.phase, quiet, keep_max=True),
    )
