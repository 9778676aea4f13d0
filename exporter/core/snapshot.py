"""The immutable snapshot the daemon publishes after each tick; renderers read only this.

Plain data, no I/O: ``/metrics``, ``/status``, the page and ``wait`` all render from one
reference to the latest Snapshot, so a scrape never touches /proc, NVML or the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.base.model import GpuSample, HostReadings, MigSample, ProcessSample, SourceStatus
from exporter.base.records import ColdStart
from exporter.core.advice import Verdicts
from exporter.core.lifecycle import TargetState
from exporter.core.trail import Trails


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """Static facts about a target, from config (the ``inference_server_info`` labels).

    ``namespace``, ``pod`` and ``container`` are a discovered target's, "" for a static one.
    """

    name: str
    engine: str
    deployment: str = ""
    model: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    """One target after a tick: its lifecycle state plus the raw samples behind it.

    Attributes:
        recent_starts: finished cold starts from history, newest first (the page draws the
            one before the current start under it); empty when the daemon passes none.
        typical_start_seconds: median duration of recent good cold starts (history), for
            "usually ready in 10m40s"; None without history.
        p95_start_seconds: the 95th percentile of recent good cold starts (history), for
            startupProbe advice; None without history.
        log_backlog_bytes: log bytes written and not read yet; None without a log file.
        log_lag_seconds: how long the log source has been behind (0 when caught up).
        orphaned_gpu_memory_bytes: per GPU index, memory still held by processes of the
            target's previous, dead instance: the next start will likely run short of it.
        trails: the movement of the current and the previous start, for the page's strips.
        stall_threshold_seconds: the current phase's stall threshold, if it has one.
        mig_memory_bytes: per MIG device UUID, memory the target's processes hold on that
            slice (also counted in ``gpu_memory_bytes`` under the parent GPU).
        verdicts: what bounded each phase of the running and of the last finished start.
    """

    info: TargetInfo
    state: TargetState
    process: ProcessSample | None = None
    gpu_memory_bytes: tuple[tuple[int, int], ...] = ()
    recent_starts: tuple[ColdStart, ...] = ()
    typical_start_seconds: float | None = None
    p95_start_seconds: float | None = None
    log_backlog_bytes: int | None = None
    log_lag_seconds: float | None = None
    orphaned_gpu_memory_bytes: tuple[tuple[int, int], ...] = ()
    trails: Trails = field(default_factory=Trails)
    stall_threshold_seconds: float | None = None
    mig_memory_bytes: tuple[tuple[str, int], ...] = ()
    verdicts: Verdicts = field(default_factory=Verdicts)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one tick produced, for every renderer.

    Attributes:
        taken_at: end of the tick, Unix epoch seconds.
        targets: one entry per configured target, in config order.
        gpus: the latest GPU sample (empty when NVML is down or absent).
        gpu_stale: the GPU sample is older than this tick (NVML hung or restarting).
        foreign_gpu_memory_bytes: per GPU index, memory held by processes of no target.
        unattributed_gpu_processes: GPU processes whose pid is outside our PID namespace.
        host: what the host-wide sources read (disk reads, memory pressure).
        sources: how each source call of this tick went.
        source_errors: per source, failed calls since start.
        tick_duration_seconds: how long sampling took.
        tick_overruns: ticks since start that took longer than the interval.
        version: exporter version, for ``inference_exporter_build_info``.
        migs: the MIG devices of MIG-enabled GPUs in the latest GPU sample.
        all_gpu_health: export every GPU health reading, not only those showing a problem.
    """

    taken_at: float
    targets: tuple[TargetSnapshot, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    gpu_stale: bool = False
    foreign_gpu_memory_bytes: tuple[tuple[int, int], ...] = ()
    unattributed_gpu_processes: int = 0
    host: HostReadings = field(default_factory=HostReadings)
    sources: tuple[SourceStatus, ...] = ()
    source_errors: tuple[tuple[str, int], ...] = ()
    #: Per discovery client, targets it found but left out (over its cap, a name taken).
    discovery_dropped: tuple[tuple[str, int], ...] = ()
    tick_duration_seconds: float = 0.0
    tick_overruns: int = 0
    version: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    migs: tuple[MigSample, ...] = ()
    all_gpu_health: bool = False
