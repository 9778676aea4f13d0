"""The lifecycle's state records: thresholds, histograms, counters and the per-target state.

Also the readings taken off a state by the shell and the renderers (probe verdict, load
times), the clock-step shift and the rules every stage shares (phase order, transitions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final, TypeVar

from exporter.base.model import (
    STARTUP_PHASES,
    EngineReport,
    FailureReason,
    LogClass,
    LogEvent,
    Phase,
    ProbeResult,
)
from exporter.base.records import ColdStart, SavedStart, Transition

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
NOTABLE_LINES_KEPT: Final = 10
TRANSITIONS_KEPT: Final = 20

ORDER: Final[Mapping[Phase, int]] = {
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

#: Allowed transitions, h11 style: anything else is a bug in ``next_phase``.
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
    # READY -> FAILED: ready by the log's word alone, then a fatal line (``unproven_ready``).
    Phase.READY: frozenset(
        {Phase.SERVING, Phase.SLEEPING, Phase.DEGRADED, Phase.DOWN, Phase.STARTING, Phase.FAILED}
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
        utc_offset_seconds: the host's zone, for the time of a failure's line where it has no
            number (seconds east of UTC: a number, so traces record it).
    """

    stall_seconds: Mapping[Phase, float] = field(default_factory=lambda: DEFAULT_STALL_SECONDS)
    degraded_after: int = 2
    weights_bytes: int | None = None
    expected_peak_gpu_bytes: int | None = None
    expected_phase_seconds: Mapping[Phase, float] = field(default_factory=dict)
    utc_offset_seconds: float = 0.0

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
    #: Processes that ended after ready (killed, crashed, out of memory), by reason: the
    #: fatal line's when one came while up, else ``exited``.
    deaths: tuple[tuple[FailureReason, int], ...] = ()
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


# Not slotted: ``evolve`` copies a state's fields as one dict (see there).
@dataclass(frozen=True)
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
    #: This exporter's first tick of the target: a process started since then started while
    #: it watched, so its cold start counts even if no tick saw it starting.
    first_tick_at: float | None = None
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
    #: The last fatal log line of this instance while it was up: the cause of its death.
    fatal_while_up: LogEvent | None = None
    #: When this instance died after ready; its reason stands while the target stays down.
    died_at: float | None = None

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
        "died_at",
        "ended_at",
        "first_tick_at",
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


def evolve(state: TargetState, **changes: Any) -> TargetState:
    """``replace``, or ``state`` itself when every value is the one it holds already.

    Most ticks of a server at rest change nothing but a timestamp. Where something changed,
    the new state is the old one's fields as one dict with the changes over them: building
    this frozen forty-field state through ``__init__`` (a ``setattr`` a field, in Python)
    cost 12-17 us where the copy costs 2, and a step builds three (replay-log steps often).
    The state has no ``__post_init__`` and every field is an ``__init__`` argument, so the
    copy is the state ``replace`` would build (a test holds them equal).
    """
    held = state.__dict__
    if all(held.get(name, _ABSENT) is value for name, value in changes.items()):
        return state
    if unknown := changes.keys() - _STATE_FIELDS:
        raise TypeError(f"TargetState has no field {min(unknown)!r}")
    new = object.__new__(TargetState)
    object.__setattr__(new, "__dict__", {**held, **changes})
    return new


_STATE_FIELDS: Final = frozenset(f.name for f in fields(TargetState))
_ABSENT: Final = object()


def phase_durations_total(state: TargetState) -> float:
    """Sum of the recorded startup phase durations (tests check it equals the cold start)."""
    return math.fsum(s for _, s in state.phase_seconds)
