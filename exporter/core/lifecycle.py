"""The lifecycle core: (previous state, observation, now) -> new state. Pure: no I/O, no clock.

Theory of operation
-------------------
Phases (DESIGN.md): ``down -> starting -> loading -> initializing -> ready -> serving``, plus
``degraded`` (was ready, probes now fail, process alive) and ``failed`` (the start ended without
becoming ready). Within one cold start the startup phases only move forward; a new process
instance (new pid or a reused pid with a new create_time) begins a new cold start.

Readiness comes from the health probe, never from guesses: the engines that matter refuse
connections until ready (vLLM, SGLang, TGI, Triton), so "connection refused + live process" is
a startup phase, not ``down``. Where no probe runs (``replay-log``), a log line announcing
readiness stands in for it.

Progress evidence, per tick, is any of: process-tree ``read_bytes`` growth (block-layer reads,
which see mmap'd safetensors), GPU memory change, RSS growth (a warm page cache shows no reads
at all, only residency), a log line that is not benign noise, shard progress, new processes in
the tree (compilers), or CPU time above a small floor. GPU utilisation alone is never evidence:
an NCCL hang shows 100 %. Disk counters are evidence only when present; their absence never
raises a stall on its own.

Stall is a flag on the startup phases: no evidence for longer than the phase's threshold. The
caller passes thresholds in (configured, or learned from this target's history) so a server
whose initialisation is silent for ten minutes every time pages no one.

Time is an argument (``now``) so traces replay exactly and tests need neither sleeps nor clock
patching. The cold start's duration is measured from the process create_time, so it survives
an exporter restart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final, TypeVar

from exporter.base.model import (
    STARTUP_PHASES,
    EngineReport,
    FailureReason,
    LogClass,
    LogEvent,
    ModelState,
    Observation,
    Phase,
    ProbeOutcome,
    ProbeResult,
)
from exporter.base.records import ColdStart, SavedStart, Transition
from exporter.core.classify import reason_detail

#: Histogram buckets of cold-start durations, seconds (up to an hour, DESIGN.md). Twelve,
#: so two targets and eight GPUs stay under STYLE.md's 200 series with every phase listed.
COLD_START_BUCKETS: Final[tuple[float, ...]] = (
    15.0,
    30.0,
    60.0,
    120.0,
    180.0,
    300.0,
    420.0,
    600.0,
    900.0,
    1200.0,
    1800.0,
    3600.0,
)
#: Histogram buckets of wake durations from sleep mode, seconds (weights back from CPU memory).
WAKE_BUCKETS: Final[tuple[float, ...]] = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
#: Default stall thresholds when neither config nor history gives one.
DEFAULT_STALL_SECONDS: Final[Mapping[Phase, float]] = {
    Phase.STARTING: 300.0,
    Phase.DOWNLOADING: 300.0,
    Phase.LOADING: 300.0,
    Phase.INITIALIZING: 900.0,
}
#: A learned threshold is this multiple of the longest quiet stretch seen before...
LEARNED_STALL_MULTIPLE: Final = 2.0
#: ...and never below this floor.
STALL_FLOOR_SECONDS: Final = 60.0
#: CPU use of the tree that counts as evidence (share of one core); idle runtimes tick below it.
CPU_EVIDENCE_CORES: Final = 0.05
#: GPU memory and RSS changes below these are noise (allocator jitter, page-cache churn).
GPU_EVIDENCE_BYTES: Final = 16 * 2**20
RSS_EVIDENCE_BYTES: Final = 4 * 2**20
#: GPU memory flat this long after loading began (and the load looks done) means initializing.
GPU_PLATEAU_SECONDS: Final = 10.0
#: Share of the weights' size read before reads alone mean loading (imports read GBs too).
LOAD_READ_SHARE: Final = 0.02
#: ...and never less than this: importing torch and an engine from a cold cache reads GBs.
LOAD_READ_FLOOR_BYTES: Final = 4 * 2**30
ETA_MIN_SECONDS: Final = 5.0
#: Weight of the newest tick in the smoothed download rate.
DOWNLOAD_RATE_WEIGHT: Final = 0.3
K = TypeVar("K")
NOTABLE_LINES_KEPT: Final = 10
TRANSITIONS_KEPT: Final = 20

_ORDER: Final[Mapping[Phase, int]] = {
    Phase.DOWN: 0,
    Phase.STARTING: 1,
    Phase.DOWNLOADING: 2,
    Phase.LOADING: 3,
    Phase.INITIALIZING: 4,
    Phase.READY: 5,
    Phase.SERVING: 6,
    Phase.SLEEPING: 6,
    Phase.DEGRADED: 6,
    Phase.FAILED: 0,
}
#: Phases of a server that finished its start and is still the same process.
UP_PHASES: Final = frozenset({Phase.READY, Phase.SERVING, Phase.SLEEPING, Phase.DEGRADED})

#: Allowed transitions, h11 style: anything else is a bug in ``_next_phase``.
TRANSITIONS: Final[Mapping[Phase, frozenset[Phase]]] = {
    Phase.DOWN: frozenset(
        {
            Phase.STARTING,
            Phase.DOWNLOADING,
            Phase.LOADING,
            Phase.INITIALIZING,
            Phase.READY,
            Phase.FAILED,
        }
    ),
    Phase.STARTING: frozenset(
        {
            Phase.DOWNLOADING,
            Phase.LOADING,
            Phase.INITIALIZING,
            Phase.READY,
            Phase.FAILED,
            Phase.DOWN,
        }
    ),
    Phase.DOWNLOADING: frozenset(
        {Phase.LOADING, Phase.INITIALIZING, Phase.READY, Phase.FAILED, Phase.DOWN}
    ),
    Phase.LOADING: frozenset({Phase.INITIALIZING, Phase.READY, Phase.FAILED, Phase.DOWN}),
    Phase.INITIALIZING: frozenset({Phase.READY, Phase.FAILED, Phase.DOWN}),
    Phase.READY: frozenset(
        {Phase.SERVING, Phase.SLEEPING, Phase.DEGRADED, Phase.DOWN, Phase.STARTING}
    ),
    Phase.SERVING: frozenset(
        {Phase.READY, Phase.SLEEPING, Phase.DEGRADED, Phase.DOWN, Phase.STARTING}
    ),
    Phase.SLEEPING: frozenset(
        {Phase.READY, Phase.SERVING, Phase.DEGRADED, Phase.DOWN, Phase.STARTING}
    ),
    Phase.DEGRADED: frozenset(
        {Phase.READY, Phase.SLEEPING, Phase.DOWN, Phase.STARTING, Phase.FAILED}
    ),
    Phase.FAILED: frozenset(
        {
            Phase.STARTING,
            Phase.DOWNLOADING,
            Phase.LOADING,
            Phase.INITIALIZING,
            Phase.READY,
            Phase.DOWN,
        }
    ),
}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Everything the core needs to know beyond the observation; built by the daemon.

    Attributes:
        stall_seconds: per startup phase, seconds without evidence before ``stalled``.
        degraded_after: consecutive failed health probes, once ready, before ``degraded``.
        weights_bytes: size of the model's weights, for read-based progress.
        expected_peak_gpu_bytes: GPU memory at the end of the last good start.
        expected_phase_seconds: typical duration of each startup phase (history), for ETA.
    """

    stall_seconds: Mapping[Phase, float] = field(default_factory=lambda: DEFAULT_STALL_SECONDS)
    degraded_after: int = 2
    weights_bytes: int | None = None
    expected_peak_gpu_bytes: int | None = None
    expected_phase_seconds: Mapping[Phase, float] = field(default_factory=dict)

    def stall_for(self, phase: Phase) -> float:
        """The stall threshold of a startup phase."""
        return self.stall_seconds.get(phase, DEFAULT_STALL_SECONDS.get(phase, 600.0))


def learned_stall_seconds(
    longest_quiet: float | None, configured: float | None, phase: Phase
) -> float:
    """Stall threshold: configured, else a multiple of the longest quiet stretch seen before."""
    if configured is not None:
        return configured
    if longest_quiet is None:
        return DEFAULT_STALL_SECONDS[phase]
    return max(STALL_FLOOR_SECONDS, LEARNED_STALL_MULTIPLE * longest_quiet)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observed durations in cumulative-ready buckets: a Prometheus histogram's content.

    ``bucket_counts`` has one entry per bound in ``bounds`` plus the +Inf bucket, each the
    count of observations in that bucket alone (the renderer accumulates).
    """

    bounds: tuple[float, ...] = COLD_START_BUCKETS
    bucket_counts: tuple[int, ...] = (0,) * (len(COLD_START_BUCKETS) + 1)
    sum_seconds: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> Histogram:
        """The histogram with one more observation."""
        i = next((i for i, b in enumerate(self.bounds) if seconds <= b), len(self.bounds))
        buckets = list(self.bucket_counts)
        buckets[i] += 1
        return replace(
            self,
            bucket_counts=tuple(buckets),
            sum_seconds=self.sum_seconds + seconds,
            count=self.count + 1,
        )


def _empty_histogram(bounds: tuple[float, ...]) -> Histogram:
    return Histogram(bounds, (0,) * (len(bounds) + 1))


@dataclass(frozen=True, slots=True)
class Wake:
    """A server woken from sleep mode: from the first sign of waking to ready again."""

    started_at: float
    ended_at: float

    @property
    def duration_seconds(self) -> float:
        """Seconds the wake took."""
        return self.ended_at - self.started_at


@dataclass(frozen=True, slots=True)
class Counters:
    """Monotonic counts kept across cold starts (exported as ``_total`` counters)."""

    restarts: int = 0
    start_failures: tuple[tuple[FailureReason, int], ...] = ()
    log_lines: tuple[tuple[LogClass, int], ...] = ()
    cold_starts: Histogram = field(default_factory=lambda: _empty_histogram(COLD_START_BUCKETS))
    #: Wakes from sleep mode; never in ``cold_starts`` (a 3 s wake is no cold start).
    wakes: Histogram = field(default_factory=lambda: _empty_histogram(WAKE_BUCKETS))


@dataclass(frozen=True, slots=True)
class Baseline:
    """Last values of cumulative signals, to tell growth (evidence) from noise."""

    read_bytes: int | None = None
    write_bytes: int | None = None
    cpu_seconds: float | None = None
    rss_bytes: int | None = None
    gpu_bytes: int | None = None
    disk_read_bytes: int | None = None
    process_count: int = 0
    gpu_changed_at: float | None = None


@dataclass(frozen=True, slots=True)
class TargetState:
    """Everything the core knows about one target after a tick; immutable, cheap to share."""

    target: str
    phase: Phase = Phase.DOWN
    phase_since: float | None = None
    reason: str = "not observed yet"
    pid: int | None = None
    create_time: float | None = None
    observed_startup: bool = False
    started_at: float | None = None
    ready_at: float | None = None
    last_progress_at: float | None = None
    last_evidence: str | None = None
    stalled: bool = False
    stall_reason: str | None = None
    progress_ratio: float | None = None
    shard_progress: tuple[tuple[str, int, int], ...] = ()
    eta_seconds: float | None = None
    failure_reason: FailureReason | None = None
    #: The decisive fatal line (redacted, cut, with its line number or time); for people only,
    #: never a label.
    reason_detail: str | None = None
    health_failures: int = 0
    last_health: ProbeResult | None = None
    last_completion: ProbeResult | None = None
    load_read_bytes: int = 0
    load_read_base: int | None = None
    peak_gpu_bytes: int | None = None
    phase_seconds: tuple[tuple[Phase, float], ...] = ()
    longest_quiet: tuple[tuple[Phase, float], ...] = ()
    baseline: Baseline = field(default_factory=Baseline)
    counters: Counters = field(default_factory=Counters)
    transitions: tuple[Transition, ...] = ()
    notable_lines: tuple[LogEvent, ...] = ()
    last_cold_start: ColdStart | None = None
    finished_start: ColdStart | None = None
    updated_at: float | None = None
    #: While sleeping: when the weights started coming back (GPU memory climbing).
    wake_began_at: float | None = None
    last_wake: Wake | None = None
    #: The fast weight loader this start's log names, and the throughput it reported.
    loader: str | None = None
    loader_bytes_per_second: float | None = None
    #: Bytes the tree wrote while downloading the model, and the recent rate.
    download_bytes: int = 0
    download_bytes_per_second: float | None = None
    #: What the engine last reported about its own startup (this instance).
    engine_report: EngineReport | None = None

    @property
    def ready(self) -> bool:
        """The server answers its readiness probe (ready or serving)."""
        return self.phase in (Phase.READY, Phase.SERVING)

    @property
    def seconds_since_progress(self) -> float | None:
        """Seconds from the last progress evidence to the last tick (frozen if the loop stalls)."""
        if self.last_progress_at is None or self.updated_at is None:
            return None
        return max(0.0, self.updated_at - self.last_progress_at)


def initial_state(target: str) -> TargetState:
    """The state of a target before its first observation."""
    return TargetState(target=target)


def saved_start(state: TargetState) -> SavedStart | None:
    """The record to keep of a state; None before any process was seen."""
    if state.pid is None or state.create_time is None:
        return None
    return SavedStart(**{name: getattr(state, name) for name in _SAVED_FIELDS})


def resume(saved: SavedStart) -> TargetState:
    """The state to continue a saved start from.

    The first observation decides whether it still applies: a different pid or create_time
    starts a new cold start as usual.
    """
    return TargetState(
        **{name: getattr(saved, name) for name in _SAVED_FIELDS},
        observed_startup=True,
        started_at=saved.create_time,
        last_progress_at=saved.phase_since,
        reason="restored after exporter restart",
    )


#: The fields a saved start shares with the state it was taken from.
_SAVED_FIELDS: Final = tuple(f.name for f in fields(SavedStart))


#: The field names that hold Unix epoch seconds anywhere in a state (and in what it holds:
#: transitions, notable lines, probe results, finished starts). Every other number is a
#: duration, a count or a ratio. Kept by naming convention, checked by the tests.
TIMESTAMP_FIELDS: Final = frozenset(
    {
        "at",
        "create_time",
        "ended_at",
        "gpu_changed_at",
        "last_progress_at",
        "phase_since",
        "ready_at",
        "started_at",
        "updated_at",
        "wake_began_at",
    }
)


def shifted(state: TargetState, seconds: float) -> TargetState:
    """The state with every timestamp moved by ``seconds``, every duration unchanged.

    For a step of the wall clock: the shell moves the core's clock with the wall and the
    state with it, so exported timestamps are right again while elapsed times, ETAs and
    time since progress go on as if nothing happened (no false stall after a step forward).
    """
    return _shift(state, seconds)


S = TypeVar("S")


def _shift(value: S, seconds: float) -> S:
    if isinstance(value, tuple):
        items = tuple(_shift(v, seconds) for v in value)
        return value if items == value else type(value)(items)
    if not hasattr(value, "__dataclass_fields__") or isinstance(value, type):
        return value
    changes: dict[str, object] = {}
    for f in fields(value):  # type: ignore[arg-type]
        old = getattr(value, f.name)
        if f.name in TIMESTAMP_FIELDS and isinstance(old, float | int):
            changes[f.name] = old + seconds
        elif isinstance(old, tuple) or hasattr(old, "__dataclass_fields__"):
            new = _shift(old, seconds)
            if new is not old:
                changes[f.name] = new
    return replace(value, **changes) if changes else value  # type: ignore[type-var]


#: Kubernetes startupProbe advice: probe this often, and allow this margin over history's p95.
PROBE_PERIOD_SECONDS: Final = 10
PROBE_MARGIN: Final = 1.5


def probe_verdict(state: TargetState) -> tuple[bool, str]:
    """For a startup or liveness probe: OK while a start progresses or the server is up.

    Fails once the start is stalled or failed, or the server is down or degraded, so a hang
    in the first minute fails the probe in a tick instead of after the whole window.
    """
    phase = state.phase
    if state.stalled:
        return False, f"stalled in {phase}: {state.stall_reason or state.reason}"
    if phase in STARTUP_PHASES:
        return True, f"{phase}, progressing: {state.reason}"
    if phase in (Phase.READY, Phase.SERVING, Phase.SLEEPING):
        return True, f"{phase}"
    return False, f"{phase}: {state.reason}"


def startup_probe_advice(p95_seconds: float | None) -> tuple[int, int] | None:
    """(periodSeconds, failureThreshold) covering 1.5x history's p95 start; None without."""
    if p95_seconds is None:
        return None
    threshold = math.ceil(PROBE_MARGIN * p95_seconds / PROBE_PERIOD_SECONDS) + 1
    return PROBE_PERIOD_SECONDS, threshold


#: Engine-timed and observed load times this far apart (seconds, and share of the longer)
#: are worth a line in ``/status``.
DISAGREE_SECONDS: Final = 10.0
DISAGREE_SHARE: Final = 0.25


def observed_load_seconds(state: TargetState) -> float | None:
    """The loading phase of the last finished start (else of this one so far)."""
    phases = state.last_cold_start.phase_seconds if state.last_cold_start else state.phase_seconds
    return dict(phases).get(Phase.LOADING)


def load_disagreement(engine: float | None, observed: float | None) -> str | None:
    """A line for people when the engine's own load time and the observed one differ widely."""
    if engine is None or observed is None:
        return None
    if abs(engine - observed) <= max(DISAGREE_SECONDS, DISAGREE_SHARE * max(engine, observed)):
        return None
    why = (
        "the observed phase also holds what the engine's timer does not (imports, reads "
        "before it, a slow first shard)"
        if observed > engine
        else "the observed loading phase began late (no marker, reads or GPU memory at first)"
    )
    return (
        f"the engine timed its load at {engine:.0f}s, loading was observed for "
        f"{observed:.0f}s: {why}"
    )


# --- evidence -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Evidence:
    kinds: tuple[str, ...]
    log_phase: Phase | None
    fatal: FailureReason | None
    gpu_grew: bool
    fatal_event: LogEvent | None = None


def _grew(new: float | None, old: float | None, floor: float) -> bool:
    return new is not None and old is not None and new - old > floor


def _gather_evidence(prev: TargetState, obs: Observation, dt: float) -> _Evidence:
    """Which progress signals moved since the previous tick."""
    base, kinds = prev.baseline, []
    p = obs.process
    if p is not None:
        if _grew(p.read_bytes, base.read_bytes, 0):
            kinds.append("read_bytes")
        if _grew(p.cpu_seconds, base.cpu_seconds, CPU_EVIDENCE_CORES * max(dt, 1e-3)):
            kinds.append("cpu")
        if _grew(p.rss_bytes, base.rss_bytes, RSS_EVIDENCE_BYTES):
            kinds.append("rss")
        if base.process_count and p.process_count > base.process_count:
            kinds.append("new_process")
        if p.read_bytes is None and _grew(obs.disk_read_bytes, base.disk_read_bytes, 0):
            kinds.append("disk_reads")
        if p.download_files and _grew(p.write_bytes, base.write_bytes, 0):
            kinds.append("download_bytes")
    gpu_grew = _grew(obs.gpu_memory_bytes, base.gpu_bytes, GPU_EVIDENCE_BYTES)
    if gpu_grew or _grew(base.gpu_bytes, obs.gpu_memory_bytes, GPU_EVIDENCE_BYTES):
        kinds.append("gpu_memory")
    log_phase, fatal, fatal_event = None, None, None
    for ev in obs.log_events:
        if ev.cls is LogClass.FATAL and ev.fatal_reason is not None and fatal is None:
            fatal, fatal_event = ev.fatal_reason, ev
        if ev.phase is not None and (log_phase is None or _ORDER[ev.phase] > _ORDER[log_phase]):
            log_phase = ev.phase
        if ev.cls is not LogClass.BENIGN and not ev.repeat:  # a flood of one line is no news
            kinds.append("shard_progress" if _is_load_progress(ev) else "logs")
    return _Evidence(tuple(dict.fromkeys(kinds)), log_phase, fatal, gpu_grew, fatal_event)


def _next_baseline(prev: Baseline, obs: Observation, evidence: _Evidence, now: float) -> Baseline:
    p = obs.process
    return Baseline(
        read_bytes=p.read_bytes if p else None,
        write_bytes=p.write_bytes if p else None,
        cpu_seconds=p.cpu_seconds if p else None,
        rss_bytes=p.rss_bytes if p else None,
        gpu_bytes=obs.gpu_memory_bytes,
        disk_read_bytes=obs.disk_read_bytes,
        process_count=p.process_count if p else 0,
        gpu_changed_at=now if "gpu_memory" in evidence.kinds else prev.gpu_changed_at,
    )


# --- phase decision -------------------------------------------------------------------------


def _health_says(health: ProbeResult | None) -> str:
    """Summarise the health probe: ok, loading, refused, failing or none."""
    if health is None:
        return "none"
    if health.ok:
        return "ok"
    if health.loading:
        return "loading"
    if health.outcome is ProbeOutcome.REFUSED:
        return "refused"
    return "failing"


def _startup_phase(
    prev: TargetState, obs: Observation, ev: _Evidence, now: float, th: Thresholds
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
    health = _health_says(obs.health)
    if health == "loading":
        candidates.append((Phase.LOADING, "health answers 503 Loading model"))
    if health == "failing" and obs.health is not None and obs.health.status_code == 503:
        candidates.append((Phase.INITIALIZING, "health answers 503 while warming up"))
    if th.weights_bytes and prev.load_read_bytes >= max(
        LOAD_READ_SHARE * th.weights_bytes, LOAD_READ_FLOOR_BYTES
    ):
        candidates.append((Phase.LOADING, "weights being read from disk"))
    if _weights_done(prev, obs, now, th):
        candidates.append((Phase.INITIALIZING, "weights in: GPU memory plateau"))
    return max(candidates, key=lambda c: _ORDER[c[0]])


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


def _next_phase(
    prev: TargetState, obs: Observation, ev: _Evidence, now: float, th: Thresholds
) -> tuple[Phase, str, FailureReason | None]:
    """Guarded transitions: the one place that decides the phase."""
    health = _health_says(obs.health)
    alive = obs.process is not None and not obs.process.zombie
    was_up = prev.phase in UP_PHASES
    in_startup = prev.phase in STARTUP_PHASES
    if obs.gpu_errors and in_startup and health != "ok":
        # The hardware's failure is the cause; the engine's crash lines that follow are not.
        return Phase.FAILED, "the GPU reported a hardware error", FailureReason.GPU_ERROR
    if ev.fatal is not None and (in_startup or prev.phase is Phase.DOWN) and health != "ok":
        return Phase.FAILED, f"fatal log line: {ev.fatal}", ev.fatal
    if in_startup and health != "ok" and (model := _failed_model(obs)) is not None:
        return Phase.FAILED, f"model {model.name} failed to load", FailureReason.CRASH
    if health == "ok" or (health == "none" and ev.log_phase is Phase.READY and alive):
        return _ready_phase(prev, obs)
    if not alive and obs.process_error is None:
        if in_startup and prev.pid is not None:
            return Phase.FAILED, "process exited before ready", FailureReason.EXITED
        if prev.phase is Phase.FAILED:
            return Phase.FAILED, prev.reason, prev.failure_reason
        if was_up:
            return Phase.DOWN, "process exited", None
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


def _failed_model(obs: Observation) -> ModelState | None:
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


# --- progress, stall and ETA ----------------------------------------------------------------


def _is_load_progress(ev: LogEvent) -> bool:
    """Weight-shard progress; other bars (CUDA-graph capture) say initializing, not loading."""
    return ev.progress is not None and ev.phase in (None, Phase.LOADING)


def _merge_shards(
    prev: tuple[tuple[str, int, int], ...], events: tuple[LogEvent, ...]
) -> tuple[tuple[str, int, int], ...]:
    """Per progress key, the furthest (done, total) seen: ranks repeat the same bar."""
    if not events:
        return prev
    merged = {k: (d, t) for k, d, t in prev}
    for ev in events:
        if ev.progress is None or not _is_load_progress(ev):
            continue
        key = ev.progress_key or "shards"
        done, total = ev.progress
        old = merged.get(key)
        if old is None or total != old[1] or done > old[0]:
            merged[key] = (max(done, old[0]) if old and total == old[1] else done, total)
    return tuple((k, d, t) for k, (d, t) in merged.items())


def _track_download(state: TargetState, obs: Observation, ev: _Evidence, dt: float) -> TargetState:
    """Bytes written while download files are open, and their rate (smoothed over ticks)."""
    p, base = obs.process, state.baseline.write_bytes
    if "download_bytes" not in ev.kinds or p is None or p.write_bytes is None or base is None:
        if state.phase is Phase.DOWNLOADING and state.download_bytes_per_second:
            return replace(state, download_bytes_per_second=0.0)  # nothing arrived this tick
        return state
    written = p.write_bytes - base
    rate = written / dt if dt > 0 else None
    old = state.download_bytes_per_second
    if rate is not None and old:
        rate = DOWNLOAD_RATE_WEIGHT * rate + (1 - DOWNLOAD_RATE_WEIGHT) * old
    return replace(
        state, download_bytes=state.download_bytes + written, download_bytes_per_second=rate
    )


def _note_loader(state: TargetState, events: Iterable[LogEvent]) -> TargetState:
    """The loader the newest line names and the newest throughput it reported."""
    loader, rate = state.loader, state.loader_bytes_per_second
    for ev in events:
        loader = ev.loader or loader
        rate = ev.loader_bytes_per_second or rate
    if (loader, rate) == (state.loader, state.loader_bytes_per_second):
        return state
    return replace(state, loader=loader, loader_bytes_per_second=rate)


def _progress_ratio(state: TargetState, obs: Observation, th: Thresholds) -> float | None:
    """Shards from logs, else bytes read over the weights' size, else GPU memory vs last peak."""
    if state.phase in (Phase.DOWN, Phase.FAILED):
        return state.progress_ratio
    if _ORDER[state.phase] >= _ORDER[Phase.INITIALIZING]:
        return 1.0
    ratio: float | None = None
    if state.phase is not Phase.LOADING and not state.shard_progress:
        return state.progress_ratio  # reads and memory before loading are imports, not weights
    if state.shard_progress:
        done = sum(d for _, d, _ in state.shard_progress)
        total = sum(t for _, _, t in state.shard_progress)
        ratio = done / total if total else None
    elif th.weights_bytes and state.load_read_bytes:
        ratio = state.load_read_bytes / th.weights_bytes
    elif th.expected_peak_gpu_bytes and obs.gpu_memory_bytes is not None:
        ratio = obs.gpu_memory_bytes / th.expected_peak_gpu_bytes
    if ratio is None:
        return state.progress_ratio
    ratio = min(1.0, max(0.0, ratio))
    return max(ratio, state.progress_ratio or 0.0)


def _eta(state: TargetState, now: float, th: Thresholds) -> float | None:
    """Seconds until ready: from the load rate plus history's init time, else history alone."""
    if state.phase not in STARTUP_PHASES or state.create_time is None:
        return None
    expected_init = th.expected_phase_seconds.get(Phase.INITIALIZING)
    ratio = state.progress_ratio
    elapsed = now - state.phase_since if state.phase_since is not None else 0.0
    # A rate needs a few seconds of loading behind it; before that, history speaks.
    if state.phase is Phase.LOADING and ratio and 0 < ratio < 1 and elapsed >= ETA_MIN_SECONDS:
        remaining_load = elapsed * (1 - ratio) / ratio
        return remaining_load + (expected_init or 0.0)
    expected_total = sum(th.expected_phase_seconds.get(p, 0.0) for p in STARTUP_PHASES)
    if expected_total <= 0:
        return None
    return max(0.0, expected_total - (now - state.create_time))


def _stall(state: TargetState, now: float, th: Thresholds) -> tuple[bool, str | None]:
    if state.phase not in STARTUP_PHASES or state.last_progress_at is None:
        return False, None
    quiet = now - state.last_progress_at
    limit = th.stall_for(state.phase)
    if quiet <= limit:
        return False, None
    return True, (
        f"no progress evidence for {quiet:.0f}s in {state.phase} (threshold "
        f"{limit:.0f}s): disk reads, GPU memory, CPU, processes and logs all quiet"
    )


# --- bookkeeping ----------------------------------------------------------------------------


def _add(
    pairs: tuple[tuple[Phase, float], ...], key: Phase, value: float, *, keep_max: bool = False
) -> tuple[tuple[Phase, float], ...]:
    d = dict(pairs)
    d[key] = max(d.get(key, 0.0), value) if keep_max else d.get(key, 0.0) + value
    return tuple(d.items())


def _bump(pairs: tuple[tuple[K, int], ...], key: K, n: int = 1) -> tuple[tuple[K, int], ...]:
    d = dict(pairs)
    d[key] = d.get(key, 0) + n
    return tuple(d.items())


def _count_lines(counters: Counters, events: tuple[LogEvent, ...]) -> Counters:
    if not events:
        return counters
    lines = counters.log_lines
    for ev in events:
        lines = _bump(lines, ev.cls)
    return replace(counters, log_lines=lines)


def _observe_cold_start(counters: Counters, seconds: float) -> Counters:
    return replace(counters, cold_starts=counters.cold_starts.observe(seconds))


def _finish_start(
    state: TargetState, now: float, outcome: str, reason: FailureReason | None
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


def _new_instance(prev: TargetState, obs: Observation) -> bool:
    p = obs.process
    return p is not None and not p.is_instance(prev.pid, prev.create_time)


def _begin_instance(prev: TargetState, obs: Observation, now: float) -> TargetState:
    """A new process: close the previous instance's story, reset the per-start fields."""
    assert obs.process is not None
    state = prev
    if prev.pid is not None:
        state = replace(
            state, counters=replace(state.counters, restarts=state.counters.restarts + 1)
        )
        if prev.phase in STARTUP_PHASES:
            state = _enter(
                state, Phase.FAILED, "process replaced before ready", FailureReason.EXITED, now
            )
        elif prev.phase in UP_PHASES:
            state = _record(state, now, Phase.DOWN, "process replaced")
    p = obs.process
    return replace(
        state,
        pid=p.pid,
        create_time=p.create_time,
        observed_startup=False,
        started_at=None,
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
        last_progress_at=p.create_time,
        stalled=False,
        stall_reason=None,
        baseline=Baseline(),
        loader=None,
        loader_bytes_per_second=None,
        download_bytes=0,
        download_bytes_per_second=None,
        engine_report=None,
    )


def _record(state: TargetState, now: float, to: Phase, reason: str) -> TargetState:
    """Enter a phase: account the time spent in the old one, remember the transition."""
    since = state.phase_since if state.phase_since is not None else now
    seconds = state.phase_seconds
    if state.phase in STARTUP_PHASES:
        seconds = _add(seconds, state.phase, max(0.0, now - since))
    t = Transition(now, state.phase, to, reason)
    return replace(
        state,
        phase=to,
        phase_since=now,
        reason=reason,
        phase_seconds=seconds,
        transitions=(*state.transitions, t)[-TRANSITIONS_KEPT:],
    )


def _track_load(state: TargetState, obs: Observation) -> TargetState:
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
    return _evolve(state, peak_gpu_bytes=peak, load_read_base=base, load_read_bytes=loaded)


def _notable(prev: tuple[LogEvent, ...], events: tuple[LogEvent, ...]) -> tuple[LogEvent, ...]:
    """The last error and fatal lines; a fatal line outlives the traceback frames after it."""
    keep = [e for e in events if e.cls in (LogClass.ERROR, LogClass.FATAL)]
    if not keep:
        return prev
    lines = [*prev, *keep]
    while len(lines) > NOTABLE_LINES_KEPT:
        oldest_error = next((i for i, e in enumerate(lines) if e.cls is LogClass.ERROR), 0)
        del lines[oldest_error]
    return tuple(lines)


# --- the step -------------------------------------------------------------------------------


def _evolve(state: TargetState, **changes: Any) -> TargetState:
    """``replace``, or ``state`` itself when every value is the one it holds already.

    Most ticks of a server at rest change nothing but a timestamp, and a replace of this
    forty-field state costs about 9 us (issue 18: a tenth of a target's tick).
    """
    if all(getattr(state, name) is value for name, value in changes.items()):
        return state
    return replace(state, **changes)


def step(prev: TargetState, obs: Observation, now: float, th: Thresholds) -> TargetState:
    """Advance one target's state by one observation taken at ``now`` (epoch seconds)."""
    state = _evolve(prev, finished_start=None)
    if _new_instance(prev, obs):
        state = _begin_instance(state, obs, now)
    dt = now - prev.updated_at if prev.updated_at is not None else 0.0
    ev = _gather_evidence(state, obs, dt)
    phase, reason, failure = _next_phase(state, obs, ev, now, th)
    state = _evolve(
        state,
        shard_progress=_merge_shards(state.shard_progress, obs.log_events),
        notable_lines=_notable(state.notable_lines, obs.log_events),
        counters=_count_lines(state.counters, obs.log_events),
    )
    if phase is Phase.FAILED and _passes_through(state.phase, ev.log_phase):
        # The same lines announced a later phase before the fatal one: keep it in the story.
        assert ev.log_phase is not None
        state = _enter(state, ev.log_phase, f"log marker announces {ev.log_phase}", None, now)
    if phase is not state.phase and phase in TRANSITIONS[state.phase]:
        state = _enter(state, phase, reason, failure, now)
        if phase is Phase.FAILED:
            state = replace(state, reason_detail=_failure_detail(ev, failure, obs))
    elif phase is state.phase and reason != state.reason:
        state = replace(state, reason=reason)
    state = _track_wake(prev, _after_probe(_track_load(state, obs), obs), ev, now)
    state = _note_loader(_track_download(state, obs, ev, dt), obs.log_events)
    if obs.health is not None and obs.health.report is not None:
        state = replace(state, engine_report=obs.health.report)
    if ev.kinds and state.phase in STARTUP_PHASES:
        state = _note_progress(state, now, ev.kinds)
    elif state.phase in STARTUP_PHASES and state.last_progress_at is not None:
        quiet = now - state.last_progress_at
        state = replace(
            state, longest_quiet=_add(state.longest_quiet, state.phase, quiet, keep_max=True)
        )
    stalled, stall_reason = _stall(state, now, th)
    state = replace(
        state,
        stalled=stalled,
        stall_reason=stall_reason,
        updated_at=now,
        baseline=_next_baseline(state.baseline, obs, ev, now),
    )
    state = _evolve(state, progress_ratio=_progress_ratio(state, obs, th))
    return _evolve(state, eta_seconds=None if state.stalled else _eta(state, now, th))


def _failure_detail(ev: _Evidence, failure: FailureReason | None, obs: Observation) -> str | None:
    """For people: the GPU events, the decisive log line, or the model the server gave up on."""
    if failure is FailureReason.GPU_ERROR and obs.gpu_errors:
        return "; ".join(obs.gpu_errors)
    if failure is ev.fatal and ev.fatal_event is not None:
        return reason_detail(ev.fatal_event)
    model = _failed_model(obs)
    if model is not None:
        return f"model {model.name} (version {model.version or '-'}): {model.reason}"
    return None


def _passes_through(current: Phase, announced: Phase | None) -> bool:
    """A log marker moved the start forward (within the startup phases) in this tick."""
    return (
        announced in STARTUP_PHASES
        and current in (Phase.DOWN, *STARTUP_PHASES)
        and announced in TRANSITIONS[current]
        and _ORDER[announced] > _ORDER[current]
    )


def _enter(
    state: TargetState, phase: Phase, reason: str, failure: FailureReason | None, now: float
) -> TargetState:
    """Apply a transition and what it implies: start seen, cold start finished, failure."""
    was_startup = state.phase in STARTUP_PHASES
    first_startup = phase in STARTUP_PHASES and state.phase in (Phase.DOWN, Phase.FAILED)
    state = _record(state, now, phase, reason)
    if first_startup:
        # The cold start began when the process did, not when we first saw it.
        since = min(now, state.create_time) if state.create_time is not None else now
        state = replace(state, observed_startup=True, phase_since=since, started_at=since)
    if phase in (Phase.READY, Phase.SERVING) and state.ready_at is None:
        finished = _finish_start(state, now, "ready", None)
        counters = state.counters
        if finished is not None:
            counters = _observe_cold_start(counters, finished.duration_seconds)
        state = replace(
            state,
            ready_at=now,
            counters=counters,
            finished_start=finished,
            last_cold_start=finished or state.last_cold_start,
            stalled=False,
        )
    elif phase is Phase.FAILED:
        reason_ = failure or FailureReason.EXITED
        finished = _finish_start(state, now, "failed", reason_) if was_startup else None
        counters = replace(
            state.counters, start_failures=_bump(state.counters.start_failures, reason_)
        )
        state = replace(
            state,
            failure_reason=reason_,
            observed_startup=False,  # this start is closed; a later ready is not its end
            counters=counters,
            finished_start=finished,
            last_cold_start=finished or state.last_cold_start,
        )
    return state


def _track_wake(prev: TargetState, state: TargetState, ev: _Evidence, now: float) -> TargetState:
    """A wake begins when GPU memory climbs in sleep and ends when the engine is awake again.

    Without a climb seen (a wake shorter than a tick), it began after the last tick that saw
    the server asleep. The wake goes to its own histogram, never to the cold-start one.
    """
    if state.phase is Phase.SLEEPING:
        if prev.phase is not Phase.SLEEPING:
            return replace(state, wake_began_at=None)
        if ev.gpu_grew and state.wake_began_at is None:
            return replace(state, wake_began_at=prev.updated_at or now)
        return state
    if prev.phase is not Phase.SLEEPING or state.phase not in (Phase.READY, Phase.SERVING):
        return replace(state, wake_began_at=None) if state.wake_began_at is not None else state
    wake = Wake(state.wake_began_at or prev.updated_at or now, now)
    counters = replace(state.counters, wakes=state.counters.wakes.observe(wake.duration_seconds))
    return replace(state, last_wake=wake, wake_began_at=None, counters=counters)


def _after_probe(state: TargetState, obs: Observation) -> TargetState:
    h = obs.health
    failures = 0 if h is None or h.ok else state.health_failures + 1
    return replace(
        state,
        health_failures=failures,
        last_health=h if h is not None else state.last_health,
        last_completion=obs.completion or state.last_completion,
    )


def _note_progress(state: TargetState, now: float, kinds: tuple[str, ...]) -> TargetState:
    quiet = now - state.last_progress_at if state.last_progress_at is not None else 0.0
    return replace(
        state,
        last_progress_at=now,
        last_evidence=", ".join(kinds),
        longest_quiet=_add(state.longest_quiet, state.phase, quiet, keep_max=True),
    )


def phase_durations_total(state: TargetState) -> float:
    """Sum of the recorded startup phase durations (tests check it equals the cold start)."""
    return math.fsum(s for _, s in state.phase_seconds)
