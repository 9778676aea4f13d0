"""Bookkeeping: counters, phase time, transitions, instances, finished starts, notable lines."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from exporter.base.model import (
    SAME_START_SECONDS,
    STARTUP_PHASES,
    FailureReason,
    LogClass,
    LogEvent,
    LogTally,
    Observation,
    Phase,
)
from exporter.base.records import ColdStart, StartOutcome, Transition
from exporter.core.failure import reason_detail
from exporter.core.lifecycle.state import (
    NOTABLE_LINES_KEPT,
    TRANSITIONS_KEPT,
    UP_PHASES,
    Baseline,
    Counters,
    TargetState,
    evolve,
)

K = TypeVar("K")


def add_seconds(
    pairs: tuple[tuple[Phase, float], ...], key: Phase, value: float, *, keep_max: bool = False
) -> tuple[tuple[Phase, float], ...]:
    """Per-phase seconds with ``value`` added to ``key`` (or kept as the maximum)."""
    d = dict(pairs)
    d[key] = max(d.get(key, 0.0), value) if keep_max else d.get(key, 0.0) + value
    return tuple(d.items())


def bump(pairs: tuple[tuple[K, int], ...], key: K, n: int = 1) -> tuple[tuple[K, int], ...]:
    """Counts with ``key`` raised by ``n``."""
    d = dict(pairs)
    d[key] = d.get(key, 0) + n
    return tuple(d.items())


def count_lines(counters: Counters, events: tuple[LogEvent, ...], tally: LogTally) -> Counters:
    """Counters with each event counted under its class, and the tally's lines under theirs."""
    if not events and not tally.counts:
        return counters
    lines = dict(counters.log_lines)
    for cls, n in tally.counts:
        lines[cls] = lines.get(cls, 0) + n
    for ev in events:
        lines[ev.cls] = lines.get(ev.cls, 0) + 1
    return replace(counters, log_lines=tuple(lines.items()))


def _observe_cold_start(counters: Counters, seconds: float) -> Counters:
    return replace(counters, cold_starts=counters.cold_starts.observe(seconds))


def _finish_start(
    state: TargetState, now: float, outcome: StartOutcome, reason: FailureReason | None
) -> ColdStart | None:
    if state.started_at is None or not state.observed_startup:
        return None
    return ColdStart(
        started_at=state.started_at,
        ended_at=now,
        outcome=outcome,
        reason=str(reason) if reason else None,
        phase_seconds=state.phase_seconds,
        longest_quiet_seconds=state.longest_quiet,
        read_bytes=state.load_read_bytes or None,
        peak_gpu_bytes=state.peak_gpu_bytes,
    )


def new_instance(prev: TargetState, obs: Observation) -> bool:
    """The observed process is another instance than the one the state follows."""
    p = obs.process
    return p is not None and not p.is_instance(prev.pid, prev.create_time)


def begin_instance(prev: TargetState, obs: Observation, now: float) -> TargetState:
    """A new process: close the previous instance's story, reset the per-start fields."""
    assert obs.process is not None
    state = prev
    went_up = _up_without_process(prev)
    if prev.pid is not None:
        state = evolve(
            state, counters=replace(state.counters, restarts=state.counters.restarts + 1)
        )
        if prev.phase in STARTUP_PHASES:
            state = enter(
                state, Phase.FAILED, "process replaced before ready", FailureReason.EXITED, now
            )
        elif prev.phase in UP_PHASES and went_up is None:
            state = record_death(state, now, "process replaced")
    p = obs.process
    fresh = started_while_watched(prev, p.create_time)
    state = _reset_start(state, p.pid, p.create_time, fresh)
    if fresh and went_up is not None:
        # Its probe answered before a scan found it: its start ended when the target went up.
        state = _ready_at(state, p.create_time, went_up if p.create_time <= went_up else now)
    return state


def _up_without_process(prev: TargetState) -> float | None:
    """When the target went up with no live process known, if it is up that way.

    A start over within a tick, between the process scan and the probe: the probe answers
    OK while the scan found nothing, and the process is found a tick later. The process
    known before, if any, had died first (its death is counted).
    """
    if prev.phase not in UP_PHASES:
        return None
    up_at = next((t.at for t in reversed(prev.transitions) if t.from_phase not in UP_PHASES), None)
    if up_at is None:
        return None
    known_alive = prev.pid is not None and (prev.died_at is None or prev.died_at > up_at)
    return None if known_alive else up_at


def _ready_at(state: TargetState, began: float, at: float) -> TargetState:
    """The new process's start (from ``began``) ended at ``at``, the tick it was seen ready."""
    unseen = add_seconds(state.phase_seconds, Phase.STARTING, max(0.0, at - began))
    finished = _finish_start(evolve(state, phase_seconds=unseen), at, StartOutcome.READY, None)
    if finished is None:
        return state
    return evolve(
        state,
        phase_seconds=unseen,
        ready_at=at,
        counters=_observe_cold_start(state.counters, finished.duration_seconds),
        finished_start=finished,
        last_cold_start=finished,
    )


def begin_unseen(state: TargetState, began: float) -> TargetState:
    """A start no process sample saw, only its log lines: a process began by ``began``.

    The process source never found it (it ended within milliseconds, before a command-line
    scan or a listening port could show it); the start is timed from ``began``.
    """
    return _reset_start(state, state.pid, began, True)


def _reset_start(
    state: TargetState, pid: int | None, create_time: float, fresh: bool
) -> TargetState:
    return evolve(
        state,
        pid=pid,
        create_time=create_time,
        observed_startup=fresh,
        started_at=create_time if fresh else None,
        ready_at=None,
        progress_ratio=None,
        shard_progress=(),
        eta_seconds=None,
        failure_reason=None,
        reason_detail=None,
        health_failures=0,
        load_read_bytes=0,
        load_read_base=None,
        peak_gpu_bytes=None,
        phase_seconds=(),
        longest_quiet=(),
        last_progress_at=create_time,
        stalled=False,
        stall_reason=None,
        baseline=Baseline(),
        loader=None,
        loader_bytes_per_second=None,
        download_bytes=0,
        download_bytes_per_second=None,
        engine_report=None,
        fatal_while_up=None,
        died_at=None,
    )


def record_death(state: TargetState, now: float, how: str) -> TargetState:
    """A process that was up ended: go down and count the death by its cause.

    What only a live process made true (its progress, its last completion) goes. The cause
    is the fatal line it printed while up (an OOM just before a kill), else ``exited``; the
    reason and its detail say which.
    """
    fatal = state.fatal_while_up
    cause = fatal.fatal_reason if fatal is not None else None
    reason = f"{how} after a fatal log line: {cause}" if cause else how
    state = record(state, now, Phase.DOWN, reason)
    counters = replace(
        state.counters, deaths=bump(state.counters.deaths, cause or FailureReason.EXITED)
    )
    return evolve(
        state,
        counters=counters,
        reason_detail=reason_detail(fatal) if fatal is not None and cause else None,
        progress_ratio=None,
        eta_seconds=None,
        last_completion=None,
        stalled=False,
        stall_reason=None,
        fatal_while_up=None,
        died_at=now,
    )


def end_with(state: TargetState, lines: tuple[LogEvent, ...], now: float) -> TargetState:
    """The previous server's last ``lines`` counted, and its death at ``now`` if it was up."""
    state = evolve(
        state,
        notable_lines=notable(state.notable_lines, lines),
        counters=count_lines(state.counters, lines, LogTally()),
    )
    if state.phase not in UP_PHASES:
        return state
    fatal = next((e for e in lines if e.cls is LogClass.FATAL and e.fatal_reason), None)
    return record_death(
        evolve(state, fatal_while_up=fatal or state.fatal_while_up), now, "process exited"
    )


def started_while_watched(prev: TargetState, create_time: float) -> bool:
    """The process began after this exporter's first tick: its whole start was watched.

    Such a start counts even when it is over before any tick sees it starting (a restart
    ready within a tick goes ``down`` -> ``ready`` at once), timed from ``create_time``.
    Start times read from /proc may run early (a clock tick; up to a second where the boot time
    behind them was /proc/stat's whole seconds, ``SAME_START_SECONDS``): a restart right after
    the first tick still counts.
    """
    first = prev.first_tick_at
    return first is not None and create_time >= first - SAME_START_SECONDS


def record(state: TargetState, now: float, to: Phase, reason: str) -> TargetState:
    """Enter a phase: account the time spent in the old one, remember the transition."""
    since = state.phase_since if state.phase_since is not None else now
    seconds = state.phase_seconds
    if state.phase in STARTUP_PHASES:
        seconds = add_seconds(seconds, state.phase, max(0.0, now - since))
    t = Transition(now, state.phase, to, reason)
    return evolve(
        state,
        phase=to,
        phase_since=now,
        reason=reason,
        phase_seconds=seconds,
        transitions=(*state.transitions, t)[-TRANSITIONS_KEPT:],
    )


def track_load(state: TargetState, obs: Observation) -> TargetState:
    """Bytes read since loading began, and the peak GPU memory of this start."""
    p = obs.process
    peak = state.peak_gpu_bytes
    if obs.gpu_memory_bytes is not None:
        peak = max(peak or 0, obs.gpu_memory_bytes)
    base, loaded = state.load_read_base, state.load_read_bytes
    if p is not None and p.read_bytes is not None and state.phase in STARTUP_PHASES:
        if base is None or p.read_bytes < base:
            base = p.read_bytes  # first sample, or a reset when a worker was reaped
        else:
            loaded = max(loaded, p.read_bytes - base)
    return evolve(state, peak_gpu_bytes=peak, load_read_base=base, load_read_bytes=loaded)


def _unseen_start(state: TargetState, to: Phase, now: float) -> float | None:
    """Seconds of a start no tick saw, when a fresh process goes straight to its end.

    The end is ready, or failed when the process was gone at its first sample.
    """
    if to not in (Phase.READY, Phase.SERVING, Phase.FAILED) or state.phase in STARTUP_PHASES:
        return None
    if not state.observed_startup or state.started_at is None or state.ready_at is not None:
        return None
    if state.phase_seconds:  # some of it was seen: that part is already accounted
        return None
    return max(0.0, now - state.started_at)


def notable(prev: tuple[LogEvent, ...], events: tuple[LogEvent, ...]) -> tuple[LogEvent, ...]:
    """The last error and fatal lines; a fatal line outlives the traceback frames after it."""
    keep = [e for e in events if e.cls in (LogClass.ERROR, LogClass.FATAL)]
    if not keep:
        return prev
    lines = [*prev, *keep]
    while len(lines) > NOTABLE_LINES_KEPT:
        oldest_error = next((i for i, e in enumerate(lines) if e.cls is LogClass.ERROR), 0)
        del lines[oldest_error]
    return tuple(lines)


def enter(
    state: TargetState, phase: Phase, reason: str, failure: FailureReason | None, now: float
) -> TargetState:
    """Apply a transition and what it implies: start seen, cold start finished, failure."""
    was_startup = state.phase in STARTUP_PHASES
    first_startup = phase in STARTUP_PHASES and state.phase in (Phase.DOWN, Phase.FAILED)
    unseen = _unseen_start(state, phase, now)
    state = record(state, now, phase, reason)
    if unseen is not None:
        # Started and ready between two ticks: its time is the start phase's, in the timeline.
        state = evolve(
            state, phase_seconds=add_seconds(state.phase_seconds, Phase.STARTING, unseen)
        )
    if first_startup:
        # The cold start began when the process did, not when we first saw it.
        since = min(now, state.create_time) if state.create_time is not None else now
        state = evolve(state, observed_startup=True, phase_since=since, started_at=since)
    if phase in (Phase.READY, Phase.SERVING) and state.ready_at is None:
        finished = _finish_start(state, now, StartOutcome.READY, None)
        counters = state.counters
        if finished is not None:
            counters = _observe_cold_start(counters, finished.duration_seconds)
        state = evolve(
            state,
            ready_at=now,
            counters=counters,
            finished_start=finished,
            last_cold_start=finished or state.last_cold_start,
            stalled=False,
        )
    elif phase is Phase.FAILED:
        reason_ = failure or FailureReason.EXITED
        closes = was_startup or unseen is not None
        finished = _finish_start(state, now, StartOutcome.FAILED, reason_) if closes else None
        counters = replace(
            state.counters, start_failures=bump(state.counters.start_failures, reason_)
        )
        state = evolve(
            state,
            failure_reason=reason_,
            observed_startup=False,  # this start is closed; a later ready is not its end
            counters=counters,
            finished_start=finished,
            last_cold_start=finished or state.last_cold_start,
        )
    return state
