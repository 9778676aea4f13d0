"""The observe stage: one tick's raw readings turned into each target's ``Observation``.

Pure: no I/O and no clock (``now`` is passed in). It classifies the log lines the sources
read, joins NVML's per-process GPU memory to the targets' process trees, applies each
target's ``gpus`` filter and stamps every observation with the tick's one time. The log
classifier's per-run memory lives in ``TargetWorld`` beside the lifecycle state, so a new
engine process starts a new log story here, where the core sees the new process first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, get_args, get_type_hints

from exporter.base.model import (
    GpuReading,
    HostReadings,
    LogEvent,
    LogReading,
    LogTally,
    ModelSize,
    Observation,
    Phase,
    ProbeResult,
    ProcessSample,
    RawLogLine,
)
from exporter.core.advice import Verdicts
from exporter.core.bounds import Bounds
from exporter.core.classify import LogClassifier
from exporter.core.gpuhealth import gpu_errors
from exporter.core.lifecycle import TargetState, Thresholds, step
from exporter.core.logread import CLASSIFY_BUDGET, TickLog
from exporter.core.trail import Trails


def host_readings(values: Mapping[str, object]) -> HostReadings:
    """Each host source's value in the ``HostReadings`` field named after the source.

    A value of another type (or None: the source failed) leaves its field None, so a source
    and its field only have to share a name and a type.
    """
    return dataclasses.replace(HostReadings(), **_named(HostReadings, values))


def target_readings(
    values: Mapping[str, object],
    errors: Mapping[str, str] | None = None,
    completion: ProbeResult | None = None,
) -> TargetReadings:
    """Each per-target source's value in the ``TargetReadings`` field named after it.

    As for the host: a value of another type (None: the source failed) leaves the field at
    its default. A failed source's reason goes in the field ``<name>_error`` where there is
    one (``process_error``: a process source that cannot look is not a process that is gone).
    """
    kept = _named(TargetReadings, values)
    kept.update(_named(TargetReadings, {f"{n}_error": e for n, e in (errors or {}).items()}))
    return dataclasses.replace(TargetReadings(completion=completion), **kept)


def _named(cls: type, values: Mapping[str, object]) -> dict[str, Any]:
    """The values whose name is a field of ``cls`` and whose type is the field's."""
    hints = _fields(cls)
    # Any: each value was type-checked against its field just now, which mypy cannot follow.
    return {n: v for n, v in values.items() if n in hints and isinstance(v, hints[n])}


@cache
def _fields(cls: type) -> dict[str, tuple[type, ...]]:
    """Field name -> the types its value may have (``X | None`` gives ``(X,)``)."""
    return {
        name: tuple(t for t in get_args(hint) if t is not type(None)) or (hint,)
        for name, hint in get_type_hints(cls).items()
    }


@dataclass(frozen=True, slots=True)
class TargetReadings:
    """What one target's own sources read in one tick.

    Each field is named after the source that fills it (``Source.name``, see
    ``target_readings``); a new per-target source adds one field here.

    Attributes:
        process: the process tree, None when there is none or its source failed.
        process_error: the process source's bounded error when it failed.
        logs: what the log source read: redacted, unclassified lines and its backlog.
        probe: the health probe's result, None when the probe source failed.
        model_size: the model's weights on disk, None without a model path or when the
            source failed (the last size measured then still counts).
        completion: a completion probe that finished since the last tick, if any.
    """

    process: ProcessSample | None = None
    process_error: str | None = None
    logs: LogReading = field(default_factory=LogReading)
    probe: ProbeResult | None = None
    model_size: ModelSize | None = None
    completion: ProbeResult | None = None


@dataclass(frozen=True, slots=True)
class GpuAttribution:
    """GPU memory split between targets, processes of no target, and pids we cannot see.

    Attributes:
        per_target: target -> GPU index -> bytes held by the target's processes.
        foreign: GPU index -> bytes held by visible processes of no target.
        unattributed_pids: distinct pids NVML lists that are not in our PID namespace.
        unattributed: GPU index -> bytes held by those pids (owner unknown, not foreign).
        orphaned: target -> GPU index -> bytes still held by processes of the target's
            previous, dead instance (workers left behind by a crash or a ``docker rm -f``).
        per_target_mig: target -> MIG device UUID -> bytes its processes hold on that
            slice; the same bytes are in ``per_target`` under the parent GPU's index.
    """

    per_target: dict[str, dict[int, int]]
    foreign: dict[int, int]
    unattributed_pids: int
    unattributed: dict[int, int] = field(default_factory=dict)
    orphaned: dict[str, dict[int, int]] = field(default_factory=dict)
    per_target_mig: dict[str, dict[str, int]] = field(default_factory=dict)


def attribute_gpu_memory(
    reading: GpuReading,
    target_pids: Mapping[str, Collection[int]],
    previous_pids: Mapping[str, Collection[int]] | None = None,
) -> GpuAttribution:
    """Join NVML's per-process memory to the targets' process trees.

    Args:
        reading: one GPU sample; each process says whether its pid is visible to us.
        target_pids: target name -> every pid of its process tree.
        previous_pids: target name -> the pids its previous instance had when it ended.
    """
    owner = {pid: target for target, pids in target_pids.items() for pid in pids}
    left_by = {pid: t for t, pids in (previous_pids or {}).items() for pid in pids}
    per_target: dict[str, dict[int, int]] = {target: {} for target in target_pids}
    orphaned: dict[str, dict[int, int]] = {}
    foreign: dict[int, int] = {}
    unattributed: dict[int, int] = {}
    hidden: set[int] = set()
    for proc in reading.processes:
        target = owner.get(proc.pid)
        if target is not None:
            bucket = per_target[target]
        elif proc.pid in left_by and proc.visible:
            bucket = orphaned.setdefault(left_by[proc.pid], {})
        elif proc.visible:
            bucket = foreign
        else:
            hidden.add(proc.pid)
            bucket = unattributed
        if proc.used_memory_bytes is not None:
            bucket[proc.gpu_index] = bucket.get(proc.gpu_index, 0) + proc.used_memory_bytes
    return GpuAttribution(
        per_target, foreign, len(hidden), unattributed, orphaned, _per_target_mig(reading, owner)
    )


def _per_target_mig(reading: GpuReading, owner: Mapping[int, str]) -> dict[str, dict[str, int]]:
    """Target -> MIG UUID -> bytes its processes hold on that slice."""
    per_mig: dict[str, dict[str, int]] = {}
    for proc in reading.processes:
        target = owner.get(proc.pid)
        if target is None or proc.mig_uuid is None or proc.used_memory_bytes is None:
            continue
        slices = per_mig.setdefault(target, {})
        slices[proc.mig_uuid] = slices.get(proc.mig_uuid, 0) + proc.used_memory_bytes
    return per_mig


@dataclass
class TargetWorld:
    """One target's core-side memory between ticks: lifecycle state and log story.

    The classifier is the one mutable part: it remembers, across the lines of one engine
    run, the year printed last, which ranks finished loading and an open traceback.
    """

    state: TargetState
    classifier: LogClassifier
    #: The last classified line with its numbers blanked, to tell a flood of repeats.
    last_line_key: str | None = None
    #: Every pid of the current instance's tree as last seen, and of the previous instance
    #: as it ended: its workers may outlive it and keep GPU memory (``attribute_gpu_memory``).
    pids: frozenset[int] = frozenset()
    previous_pids: frozenset[int] = frozenset()
    #: The GPUs the target was last seen holding memory on: a GPU that fell off the bus
    #: lists no processes any more, yet its events still concern the target.
    gpu_indices: frozenset[int] = frozenset()
    #: The movement of the current and the previous start, for the page.
    trails: Trails = field(default_factory=Trails)
    #: What bounded each phase of the running start, and its verdicts (``follow_bounds``).
    bounds: Bounds = field(default_factory=Bounds)
    verdicts: Verdicts = field(default_factory=Verdicts)
    #: The phase and stall flag at the last tick (None: not stepped yet), to tell edges.
    last_phase: Phase | None = None
    last_stalled: bool = False
    #: The last model size measured: a model-size source that failed once changes nothing.
    weights_bytes: int | None = None


def note_instance(world: TargetWorld, readings: TargetReadings) -> None:
    """Remember the tree's pids; a replaced or ended instance's pids become the previous.

    Before the GPU join of the tick, so workers left by an engine that died this tick are
    orphaned at once, not foreign for a tick.
    """
    process = readings.process
    # A zombie main has lost its children to a reaper already: the last live tree counts.
    ended = (process is None and readings.process_error is None) or (
        process is not None and process.zombie
    )
    replaced = process is not None and _new_process(world.state, process)
    if (ended or replaced) and world.pids:
        world.previous_pids = world.pids
        world.pids = frozenset()
    if process is not None and not process.zombie:
        world.pids = frozenset(process.pids)


def forget_departed(world: TargetWorld, name: str, attribution: GpuAttribution) -> None:
    """Once no process of the previous instance holds GPU memory, stop looking for them.

    A pid the kernel hands out again later is then never taken for an orphan.
    """
    if world.previous_pids and name not in attribution.orphaned:
        world.previous_pids = frozenset()


@dataclass(frozen=True, slots=True)
class Observed:
    """What observing one target produced: its observation and its GPUs' memory."""

    observation: Observation
    gpu_memory_bytes: tuple[tuple[int, int], ...]
    #: MIG UUID -> bytes, for the slices the target's processes run on.
    mig_memory_bytes: tuple[tuple[str, int], ...] = ()


def classify_lines(
    world: TargetWorld,
    process: ProcessSample | None,
    lines: tuple[RawLogLine, ...] | LogReading,
    *,
    process_gone: bool = False,
    budget: int = CLASSIFY_BUDGET,
) -> tuple[LogEvent, ...]:
    """``read_log`` with every line made an event, the plain ones too: for showing each line."""
    events, _ = read_log(
        world, process, lines, process_gone=process_gone, budget=budget, every_line=True
    )
    return events


def read_log(
    world: TargetWorld,
    process: ProcessSample | None,
    lines: tuple[RawLogLine, ...] | LogReading,
    *,
    process_gone: bool = False,
    budget: int = CLASSIFY_BUDGET,
    every_line: bool = False,
) -> tuple[tuple[LogEvent, ...], LogTally]:
    """The tick's log evidence as one batch: events of the lines that matched, a tally of the rest.

    A new engine process starts a new story first. A line the classifier's screen rules out
    (``LogClassifier.plain``; a whole block of them at once: most of a serving engine's log)
    is only counted (``logread.TickLog``). Once the process is gone its log has ended: a
    failure a wrapper line announced, whose cause never came, becomes a crash (``finish``).
    """
    classifier = world.classifier
    if _new_process(world.state, process):
        classifier.reset()
    reading = lines if isinstance(lines, LogReading) else LogReading(lines)
    tick = TickLog(world, budget=budget, every_line=every_line)
    tick.lines(reading.lines)
    if reading.block is not None:
        tick.block(reading.block)
    tally = tick.tally()
    if process_gone and world.state.pid is not None:
        tick.events += classifier.finish()
    return tuple(tick.events), tally


def _new_process(state: TargetState, process: ProcessSample | None) -> bool:
    if process is None or state.pid is None:
        return False
    return not process.is_instance(state.pid, state.create_time)


def observe(
    name: str,
    world: TargetWorld,
    readings: TargetReadings,
    host: HostReadings,
    gpu: GpuReading,
    attribution: GpuAttribution,
    *,
    gpus: Collection[int | str] | None,
    now: float,
) -> Observed:
    """One target's observation for this tick.

    Args:
        name: the target.
        world: its core-side memory (the classifier advances here).
        readings: what its own sources read.
        host: what the host-wide sources read.
        gpu: what NVML read (its last reading, marked stale, when it failed this tick).
        attribution: the tick's GPU memory join (``attribute_gpu_memory``).
        gpus: the GPUs the target is limited to (indices, GPU or MIG UUIDs), None for all.
        now: the tick's time, stamped on the observation.
    """
    per_gpu = attribution.per_target.get(name, {})
    per_mig = attribution.per_target_mig.get(name, {})
    if gpus is not None:
        per_gpu, per_mig = _selected_gpus(gpus, per_gpu, per_mig, gpu)
    events, tally = read_log(
        world,
        readings.process,
        readings.logs,
        process_gone=readings.process is None and readings.process_error is None,
    )
    obs = Observation(
        target=name,
        at=now,
        process=readings.process,
        process_error=readings.process_error,
        health=readings.probe,
        completion=readings.completion,
        disk_read_bytes=host.disk.read_bytes if host.disk else None,
        gpu_memory_bytes=sum(per_gpu.values()) if gpu.gpus else None,
        log_events=events,
        log_tally=tally,
        gpu_errors=_target_gpu_errors(world, gpu, per_gpu, gpus),
    )
    return Observed(obs, tuple(sorted(per_gpu.items())), tuple(sorted(per_mig.items())))


def _selected_gpus(
    gpus: Collection[int | str],
    per_gpu: Mapping[int, int],
    per_mig: Mapping[str, int],
    reading: GpuReading,
) -> tuple[dict[int, int], dict[str, int]]:
    """A target's memory on the GPUs its ``gpus`` names: whole GPUs, or only MIG slices.

    A GPU named by index or UUID keeps all of the target's memory there; a MIG UUID keeps
    the target's memory on that slice only, counted under its parent GPU.
    """
    whole = {g for g in gpus if isinstance(g, int)} | {
        s.index for s in reading.gpus if s.uuid in gpus
    }
    parent = {m.uuid: m.gpu_index for m in reading.migs}
    kept_gpu = {i: b for i, b in per_gpu.items() if i in whole}
    kept_mig: dict[str, int] = {}
    for uuid, used in per_mig.items():
        index = parent.get(uuid)
        if index in whole:
            kept_mig[uuid] = used
        elif uuid in gpus:
            kept_mig[uuid] = used
            if index is not None:
                kept_gpu[index] = kept_gpu.get(index, 0) + used
    return kept_gpu, kept_mig


def _target_gpu_errors(
    world: TargetWorld,
    gpu: GpuReading,
    per_gpu: Mapping[int, int],
    gpus: Collection[int | str] | None,
) -> tuple[str, ...]:
    """Critical events on the GPUs the target uses, worded for people.

    The GPUs used are those its ``gpus`` names (a MIG slice names its parent GPU: an Xid is
    the whole GPU's), else those it holds memory on (now or last seen). A stale reading is
    last tick's: its events were seen then.
    """
    if per_gpu:
        world.gpu_indices = frozenset(per_gpu)
    if gpu.stale:
        return ()
    used = world.gpu_indices if gpus is None else _named_gpu_indices(gpus, gpu)
    return gpu_errors(gpu.gpus, used)


def _named_gpu_indices(gpus: Collection[int | str], reading: GpuReading) -> frozenset[int]:
    """The indices of the GPUs a ``gpus`` setting names, by index, GPU UUID or MIG UUID."""
    by_uuid = {s.uuid: s.index for s in reading.gpus}
    by_uuid.update({m.uuid: m.gpu_index for m in reading.migs})
    return frozenset(g if isinstance(g, int) else by_uuid.get(g, -1) for g in gpus) - {-1}


def advance(world: TargetWorld, obs: Observation, now: float, th: Thresholds) -> TargetWorld:
    """Step the lifecycle with one observation; the classifier carries on with the world."""
    return dataclasses.replace(world, state=step(world.state, obs, now, th))
