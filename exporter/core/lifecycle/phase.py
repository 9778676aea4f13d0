"""The phase decision: guarded transitions from the evidence and the probes."""

from __future__ import annotations

import enum
from typing import Final

from exporter.base.model import (
    STARTUP_PHASES,
    FailureReason,
    ModelState,
    Observation,
    Phase,
    ProbeOutcome,
    ProbeResult,
)
from exporter.core.lifecycle.evidence import Evidence
from exporter.core.lifecycle.state import (
    GPU_PLATEAU_SECONDS,
    LOAD_READ_FLOOR_BYTES,
    LOAD_READ_SHARE,
    ORDER,
    UP_PHASES,
    TargetState,
    Thresholds,
)


class Health(enum.Enum):
    """What this tick's health probe says, as the phase decision reads it."""

    NONE = "none"  # no probe ran (replay-log, or the probe is off)
    OK = "ok"
    LOADING = "loading"  # an answer that names a model load (503 Loading model)
    REFUSED = "refused"
    FAILING = "failing"  # any other failed answer


def health_says(health: ProbeResult | None) -> Health:
    """Summarise the health probe for the phase decision."""
    if health is None:
        return Health.NONE
    if health.ok:
        return Health.OK
    if health.loading:
        return Health.LOADING
    if health.outcome is ProbeOutcome.REFUSED:
        return Health.REFUSED
    return Health.FAILING


def _startup_phase(
    prev: TargetState, obs: Observation, ev: Evidence, now: float, th: Thresholds
) -> tuple[Phase, str]:
    """The startup phase the evidence supports; never earlier than the current one."""
    current = prev.phase if prev.phase in STARTUP_PHASES else Phase.STARTING
    candidates: list[tuple[Phase, str]] = [
        (current, prev.reason if current is prev.phase else "process started")
    ]
    if ev.log_phase in STARTUP_PHASES:
        candidates.append((ev.log_phase, f"log marker announces {ev.log_phase}"))
    if obs.process is not None and obs.process.download_files:
        files = obs.process.download_files
        candidates.append((Phase.DOWNLOADING, f"model downloading ({files} files being written)"))
    if ev.gpu_grew:
        candidates.append((Phase.LOADING, "GPU memory climbing"))
    if "shard_progress" in ev.kinds:
        candidates.append((Phase.LOADING, "shard progress in logs"))
    health = health_says(obs.health)
    if health is Health.LOADING:
        candidates.append((Phase.LOADING, "health answers 503 Loading model"))
    if health is Health.FAILING and obs.health is not None and obs.health.status_code == 503:
        candidates.append((Phase.INITIALIZING, "health answers 503 while warming up"))
    if th.weights_bytes and prev.load_read_bytes >= max(
        LOAD_READ_SHARE * th.weights_bytes, LOAD_READ_FLOOR_BYTES
    ):
        candidates.append((Phase.LOADING, "weights being read from disk"))
    if _weights_done(prev, obs, now, th):
        candidates.append((Phase.INITIALIZING, "weights in: GPU memory plateau"))
    return max(candidates, key=lambda c: ORDER[c[0]])


def _weights_done(prev: TargetState, obs: Observation, now: float, th: Thresholds) -> bool:
    """GPU memory stopped climbing after loading, and the load looks complete."""
    if prev.phase is not Phase.LOADING or not obs.gpu_memory_bytes:
        return False
    changed = prev.baseline.gpu_changed_at
    if changed is None or now - changed < GPU_PLATEAU_SECONDS:
        return False
    if th.expected_peak_gpu_bytes:
        return obs.gpu_memory_bytes >= 0.9 * th.expected_peak_gpu_bytes
    # Without a progress figure a plateau is ambiguous (a hung load looks the same): stay.
    return prev.progress_ratio is not None and prev.progress_ratio >= 0.95


#: How long after a ready line no probe confirmed a fatal line still fails the start.
UNPROVEN_READY_SECONDS: Final = 60.0


def next_phase(
    prev: TargetState, obs: Observation, ev: Evidence, now: float, th: Thresholds
) -> tuple[Phase, str, FailureReason | None]:
    """Guarded transitions: the one place that decides the phase."""
    health = health_says(obs.health)
    alive = obs.process is not None and not obs.process.zombie
    was_up = prev.phase in UP_PHASES
    in_startup = prev.phase in STARTUP_PHASES
    if obs.gpu_errors and in_startup and health is not Health.OK:
        # The hardware's failure is the cause; the engine's crash lines that follow are not.
        return Phase.FAILED, "the GPU reported a hardware error", FailureReason.GPU_ERROR
    fatal_now = ev.fatal is not None and (
        in_startup or prev.phase is Phase.DOWN or unproven_ready(prev, obs, now)
    )
    if fatal_now and health is not Health.OK:
        return Phase.FAILED, f"fatal log line: {ev.fatal}", ev.fatal
    if in_startup and health is not Health.OK and (model := failed_model(obs)) is not None:
        return Phase.FAILED, f"model {model.name} failed to load", FailureReason.CRASH
    if health is Health.OK or (health is Health.NONE and ev.log_phase is Phase.READY and alive):
        return _ready_phase(prev, obs)
    if not alive and obs.process_error is None:
        if in_startup and prev.pid is not None:
            return Phase.FAILED, "process exited before ready", FailureReason.EXITED
        if obs.process is not None and unsampled_start(prev):
            return Phase.FAILED, "process exited before its first sample", FailureReason.EXITED
        if prev.phase is Phase.FAILED:
            return Phase.FAILED, prev.reason, prev.failure_reason
        if was_up:
            return Phase.DOWN, "process exited", None
        if prev.phase is Phase.DOWN and prev.died_at is not None:
            return Phase.DOWN, prev.reason, None  # how it died stands while it stays down
        return Phase.DOWN, _down_reason(obs), None
    if was_up:
        if prev.health_failures + 1 >= th.degraded_after:
            outcome = obs.health.outcome if obs.health else "none"
            return Phase.DEGRADED, f"health probe {outcome}", None
        return prev.phase, prev.reason, None
    if prev.phase is Phase.FAILED and prev.failure_reason is not None:
        return Phase.FAILED, prev.reason, prev.failure_reason
    if obs.process is None:  # process source failed this tick: keep what we knew
        return prev.phase, prev.reason, prev.failure_reason
    phase, reason = _startup_phase(prev, obs, ev, now, th)
    return phase, reason, None


def unproven_ready(state: TargetState, obs: Observation, now: float) -> bool:
    """Ready by the log's word alone, moments ago: no probe has ever answered the target.

    A listening line is a promise, not proof: a server that then panics, aborts or runs out
    of memory within ``UNPROVEN_READY_SECONDS`` failed its start (a native runtime crashing
    just after "listening on", the start ``replay-log`` reads). With a probe that answered
    OK the server was up, and a fatal line hours later is a death (vllm-20-ready).
    """
    return (
        state.phase is Phase.READY
        and state.last_health is None
        and obs.health is None
        and state.ready_at is not None
        and now - state.ready_at <= UNPROVEN_READY_SECONDS
    )


def unsampled_start(state: TargetState) -> bool:
    """A process started while watched whose start no tick saw begin, nor end.

    Such a process found already gone (a zombie, or a pid its pidfile named after the last
    sample) ended its start before any tick sampled it alive: a failed start, not a down.
    """
    return (
        state.observed_startup
        and state.started_at is not None
        and state.ready_at is None
        and state.phase not in STARTUP_PHASES
        and state.phase is not Phase.FAILED
    )


def failed_model(obs: Observation) -> ModelState | None:
    """A model the server reports it gave up loading (Triton: UNAVAILABLE with a reason)."""
    report = obs.health.report if obs.health is not None else None
    return next((m for m in report.models if m.failed), None) if report else None


def _ready_phase(prev: TargetState, obs: Observation) -> tuple[Phase, str, None]:
    if obs.health is not None and obs.health.sleeping and prev.ready_at is not None:
        return Phase.SLEEPING, "engine reports sleep mode (weights offloaded)", None
    if prev.phase is Phase.SLEEPING and obs.health is not None and obs.health.sleeping is None:
        return Phase.SLEEPING, prev.reason, None  # it did not say this tick: nothing changed
    if prev.phase is Phase.SLEEPING:
        return Phase.READY, "woke from sleep mode", None
    comp = obs.completion
    if comp is not None and comp.ok and comp.has_choices and prev.ready:
        return Phase.SERVING, "a completion returned choices", None
    if prev.phase is Phase.SERVING and (comp is None or comp.ok):
        return Phase.SERVING, prev.reason, None
    if comp is not None and not comp.ok and prev.phase is Phase.SERVING:
        return Phase.READY, f"completion probe {comp.outcome}", None
    how = "health probe answers OK" if obs.health is not None else "log announces ready"
    return Phase.READY, how, None


def _down_reason(obs: Observation) -> str:
    if obs.health is not None and obs.health.outcome is ProbeOutcome.REFUSED:
        return "no process; connection refused"
    return "no process found"
