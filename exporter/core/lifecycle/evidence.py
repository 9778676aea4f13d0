"""Evidence: which progress signals moved since the previous tick."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.base.model import FailureReason, LogClass, LogEvent, Observation, Phase
from exporter.core.lifecycle.progress import is_load_progress
from exporter.core.lifecycle.state import (
    CPU_EVIDENCE_CORES,
    GPU_EVIDENCE_BYTES,
    ORDER,
    RSS_EVIDENCE_BYTES,
    Baseline,
    TargetState,
)


@dataclass(frozen=True, slots=True)
class Evidence:
    """The progress signals that moved this tick, the latest log phase and the first fatal line."""

    kinds: tuple[str, ...]
    log_phase: Phase | None
    fatal: FailureReason | None
    gpu_grew: bool
    fatal_event: LogEvent | None = None


def _grew(new: float | None, old: float | None, floor: float) -> bool:
    return new is not None and old is not None and new - old > floor


def gather_evidence(prev: TargetState, obs: Observation, dt: float) -> Evidence:
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
        if ev.phase is not None and (log_phase is None or ORDER[ev.phase] > ORDER[log_phase]):
            log_phase = ev.phase
        if ev.cls is not LogClass.BENIGN and not ev.repeat:  # a flood of one line is no news
            kinds.append("shard_progress" if is_load_progress(ev) else "logs")
    if obs.log_tally.news:  # lines no pattern matched, not request traffic, not one repeated
        kinds.append("logs")

    return Evidence(tuple(dict.fromkeys(kinds)), log_phase, fatal, gpu_grew, fatal_event)


def next_baseline(prev: Baseline, obs: Observation, evidence: Evidence, now: float) -> Baseline:
    """The cumulative values this tick ends with, for the next tick's comparisons."""
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
