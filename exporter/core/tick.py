"""One tick of the core as one pure step: every target's readings in, its new world out.

``advance_tick`` runs the named steps in their order, for every target at once:

1. ``shifted``: a wall-clock step the shell's clock re-anchored on moves every kept time;
2. ``note_instance``: a replaced or ended engine's pids become the previous instance's;
3. ``attribute_gpu_memory``: NVML's per-process memory joined to the trees (one join);
4. ``observe``: log lines classified, GPU memory and errors picked, one timestamp;
5. ``forget_departed``: an old instance no longer holding GPU memory is forgotten;
6. ``step``: the lifecycle state machine, with the model size the source measured;
7. ``follow`` and ``follow_bounds``: the page's trails, what bounds each phase;
8. the target's ``TargetSnapshot``, finished here and nowhere else.

It returns values only (new worlds, snapshots, finished starts, the start to save, phase
and stall edges); the shell writes history and logs from them. The input worlds are left
as they were, but for the log classifier they share (the one mutable part of the core).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

from exporter.base.model import STARTUP_PHASES, GpuReading, HostReadings, Observation, Phase
from exporter.base.records import ColdStart, SavedStart
from exporter.core.advice import follow_bounds
from exporter.core.lifecycle import TargetState, Thresholds, saved_start, shifted, step
from exporter.core.observe import (
    GpuAttribution,
    TargetReadings,
    TargetWorld,
    attribute_gpu_memory,
    forget_departed,
    note_instance,
    observe,
)
from exporter.core.snapshot import TargetInfo, TargetSnapshot
from exporter.core.trail import follow

#: Finished cold starts shown per target (the page draws the previous one under this one).
RECENT_STARTS_SHOWN: Final = 2


@dataclass(frozen=True, slots=True)
class TargetPlan:
    """What the shell knows of a target that the core needs: its config and its history.

    Attributes:
        info: the target's static facts (the ``inference_server_info`` labels).
        thresholds: stall thresholds and expectations learned from history; the weights'
            size comes from the model-size reading instead.
        gpus: the GPUs the target is limited to (indices, GPU or MIG UUIDs), None for all.
        typical_start_seconds: median of recent good starts, None without history.
        p95_start_seconds: their 95th percentile, None without history.
        recent_starts: finished starts from history, newest first.
    """

    info: TargetInfo
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    gpus: Collection[int | str] | None = None
    typical_start_seconds: float | None = None
    p95_start_seconds: float | None = None
    recent_starts: tuple[ColdStart, ...] = ()


@dataclass(frozen=True, slots=True)
class ClockShift:
    """How the wall clock stepped: this tick (``step``) and since the exporter started."""

    step: float = 0.0
    total: float = 0.0


@dataclass(frozen=True, slots=True)
class PhaseEdge:
    """A phase change, for the shell's log line."""

    before: Phase
    after: Phase
    after_seconds: float
    reason: str | None


@dataclass(frozen=True, slots=True)
class TargetOutcome:
    """What one tick made of one target.

    Attributes:
        world: the target's memory for the next tick.
        snapshot: the target as published.
        observation: what the lifecycle was stepped with (for record/replay).
        thresholds: the thresholds it was stepped with.
        finished: a cold start that ended this tick, for history.
        save: the start in progress to save (a phase changed, or a start goes on).
        phase_edge: the phase changed this tick (not on the first tick).
        stalled_now: the start was found stalled this tick.
    """

    world: TargetWorld
    snapshot: TargetSnapshot
    observation: Observation
    thresholds: Thresholds
    finished: ColdStart | None = None
    save: SavedStart | None = None
    phase_edge: PhaseEdge | None = None
    stalled_now: bool = False


@dataclass(frozen=True, slots=True)
class TickResult:
    """Every target's outcome, in input order, and the tick's one GPU memory join."""

    targets: tuple[TargetOutcome, ...]
    attribution: GpuAttribution


def advance_tick(
    worlds: Sequence[TargetWorld],
    readings: Sequence[TargetReadings],
    plans: Sequence[TargetPlan],
    host: HostReadings,
    gpu: GpuReading,
    now: float,
    *,
    clock: ClockShift = ClockShift(),
) -> TickResult:
    """Advance every target by one tick (see the module doc for the steps).

    Args:
        worlds: each target's memory from the last tick (``TargetWorld``).
        readings: what each target's own sources read this tick, in the same order.
        plans: each target's config and history, in the same order.
        host: what the host-wide sources read.
        gpu: what the GPU sources read (their last reading, marked stale, when they failed).
        now: the tick's time, epoch seconds on the shell's anchored clock.
        clock: the wall-clock step to follow; process start times, read on the boot clock,
            move by all the steps since the exporter started.
    """
    fresh = [_prepared(w, r, clock) for w, r in zip(worlds, readings, strict=True)]
    for world, r in fresh:
        note_instance(world, r)
    attribution = attribute_gpu_memory(
        gpu,
        {  # an exited (zombie) main's tree is over: what it left behind is orphaned
            plan.info.name: r.process.pids
            for (_w, r), plan in zip(fresh, plans, strict=True)
            if r.process is not None and not r.process.zombie
        },
        {
            p.info.name: w.previous_pids
            for (w, _r), p in zip(fresh, plans, strict=True)
            if w.previous_pids
        },
    )
    outcomes = tuple(
        _advance_target(world, r, plan, host, gpu, attribution, now)
        for (world, r), plan in zip(fresh, plans, strict=True)
    )
    return TickResult(outcomes, attribution)


def _prepared(
    world: TargetWorld, readings: TargetReadings, clock: ClockShift
) -> tuple[TargetWorld, TargetReadings]:
    """A copy of the world to advance, and the readings on the tick's clock."""
    state = shifted(world.state, clock.step) if clock.step else world.state
    process = readings.process
    if process is not None and clock.total:
        process = dataclasses.replace(process, create_time=process.create_time + clock.total)
        readings = dataclasses.replace(readings, process=process)
    return dataclasses.replace(world, state=state), readings


def _advance_target(
    world: TargetWorld,
    readings: TargetReadings,
    plan: TargetPlan,
    host: HostReadings,
    gpu: GpuReading,
    attribution: GpuAttribution,
    now: float,
) -> TargetOutcome:
    name = plan.info.name
    seen = observe(name, world, readings, host, gpu, attribution, gpus=plan.gpus, now=now)
    forget_departed(world, name, attribution)
    if readings.model_size is not None:
        world.weights_bytes = readings.model_size.weights_bytes
    th = plan.thresholds
    if th.weights_bytes != world.weights_bytes:  # a copy only for a measured size
        th = dataclasses.replace(th, weights_bytes=world.weights_bytes)
    before, was_stalled = world.last_phase, world.last_stalled
    state = step(world.state, seen.observation, now, th)
    trails = follow(world.trails, seen.observation, state, seen.gpu_memory_bytes)
    bounds, verdicts = follow_bounds(
        world.bounds, world.verdicts, seen.observation, state, gpu.gpus, seen.gpu_memory_bytes
    )
    world = dataclasses.replace(
        world,
        state=state,
        trails=trails,
        bounds=bounds,
        verdicts=verdicts,
        last_phase=state.phase,
        last_stalled=state.stalled,
    )
    finished = state.finished_start
    recent = plan.recent_starts
    if finished is not None:  # history has it from now on; the page shows it at once
        recent = (finished, *recent)[:RECENT_STARTS_SHOWN]
    orphaned = tuple(sorted(attribution.orphaned.get(name, {}).items()))
    logs = readings.logs
    lag = None
    if logs.backlog_bytes is not None:
        lag = 0.0 if logs.behind_since is None else max(0.0, now - logs.behind_since)
    snapshot = TargetSnapshot(
        info=plan.info,
        state=state,
        process=seen.observation.process,
        gpu_memory_bytes=seen.gpu_memory_bytes,
        typical_start_seconds=plan.typical_start_seconds,
        p95_start_seconds=plan.p95_start_seconds,
        recent_starts=recent,
        trails=trails,
        verdicts=verdicts,
        stall_threshold_seconds=th.stall_seconds.get(state.phase),
        orphaned_gpu_memory_bytes=orphaned,
        mig_memory_bytes=seen.mig_memory_bytes,
        log_backlog_bytes=logs.backlog_bytes,
        log_lag_seconds=lag,
    )
    return TargetOutcome(
        world=world,
        snapshot=snapshot,
        observation=seen.observation,
        thresholds=th,
        finished=finished,
        save=saved_start(state)
        if state.phase is not before or state.phase in STARTUP_PHASES
        else None,
        phase_edge=_phase_edge(before, state),
        stalled_now=state.stalled and not was_stalled,
    )


def _phase_edge(before: Phase | None, state: TargetState) -> PhaseEdge | None:
    if before is None or state.phase is before:
        return None
    since, start = state.phase_since, state.create_time
    elapsed = 0.0 if since is None or start is None else max(0.0, since - start)
    return PhaseEdge(before, state.phase, elapsed, state.reason)
