"""Snapshot -> the ``/status`` JSON document (also read by ``wait``, ``status`` and the page).

No I/O. Everything shown here is already redacted: log lines arrive redacted from the
classifier, and no command line, URL credential or API key is ever part of a snapshot.
"""

from __future__ import annotations

import json

from exporter.base.model import GpuSample, LogEvent, MigSample, Phase, ProbeResult
from exporter.base.records import ColdStart, Transition
from exporter.core.gpuhealth import throttle_active, xid_label_counts
from exporter.core.lifecycle import (
    TargetState,
    load_disagreement,
    observed_load_seconds,
    probe_verdict,
    startup_probe_advice,
)
from exporter.core.snapshot import Snapshot, TargetSnapshot
from exporter.render.bounds import phase_bound_doc
from exporter.render.status_doc import (
    ColdStartDoc,
    EngineReportDoc,
    GpuDoc,
    GpuHealthDoc,
    GpuMemoryDoc,
    LineDoc,
    MigDoc,
    MigMemoryDoc,
    ProbeDoc,
    ProcessDoc,
    SourceDoc,
    StartupProbeDoc,
    StatusDoc,
    TargetDoc,
    TimelineRowDoc,
    TransitionDoc,
    WakeDoc,
)

#: Startup phases in the order a cold start passes through them (the timeline's order).
_TIMELINE_ORDER = (Phase.STARTING, Phase.DOWNLOADING, Phase.LOADING, Phase.INITIALIZING)


def render_status(snap: Snapshot | None) -> StatusDoc:
    """The whole status document as plain JSON-ready data."""
    if snap is None:
        return {"ready": False, "targets": [], "sources": [], "gpus": []}
    return {
        "ready": True,
        "version": snap.version,
        "taken_at": snap.taken_at,
        "sampled_at": snap.taken_at - snap.tick_duration_seconds,
        "targets": [_target(t, snap.taken_at, snap.gpus, snap.migs) for t in snap.targets],
        "gpus": [_gpu(g) for g in snap.gpus],
        "migs": [_mig(m) for m in snap.migs],
        "gpu_stale": snap.gpu_stale,
        "foreign_gpu_memory_bytes": {str(i): b for i, b in snap.foreign_gpu_memory_bytes},
        "sources": [
            SourceDoc(
                source=s.source,
                target=s.target,
                up=s.up,
                state="absent" if s.absent else "up" if s.up else "down",
                error=s.error,
            )
            for s in snap.sources
        ],
    }


def _gpu(g: GpuSample) -> GpuDoc:
    return {
        "gpu": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "up": g.up,
        "memory_used_bytes": g.memory_used_bytes,
        "memory_total_bytes": g.memory_total_bytes,
        "utilization_ratio": g.utilization_ratio,
        "error": g.error,
        "mig_enabled": g.mig_enabled,
        "health": _gpu_health(g),
    }


def _gpu_health(g: GpuSample) -> GpuHealthDoc:
    throttle = g.throttle_reasons
    link = None
    if g.pcie_link_generation is not None:
        link = (
            f"Gen{g.pcie_link_generation} x{g.pcie_link_width} "
            f"(max Gen{g.pcie_link_generation_max} x{g.pcie_link_width_max})"
        )
    return {
        "xid_errors": dict(xid_label_counts(g.xid_counts)),
        "ecc_uncorrected_volatile": g.ecc_uncorrected_volatile,
        "retired_pages_pending": g.retired_pages_pending,
        "remapped_rows_pending": g.remapped_rows_pending,
        "remapped_rows_failed": g.remapped_rows_failed,
        "throttle_reasons": None
        if throttle is None
        else [name for name, on in throttle_active(throttle).items() if on],
        "pcie_link": link,
        "unsupported": list(g.unsupported),
    }


def _mig(m: MigSample) -> MigDoc:
    return {
        "mig_uuid": m.uuid,
        "gpu": m.gpu_index,
        "gpu_instance_id": m.gpu_instance_id,
        "compute_instance_id": m.compute_instance_id,
        "profile": m.profile,
        "memory_used_bytes": m.memory_used_bytes,
        "memory_total_bytes": m.memory_total_bytes,
    }


def status_json(snap: Snapshot | None) -> bytes:
    """The status document encoded as UTF-8 JSON."""
    return json.dumps(render_status(snap), separators=(",", ":")).encode()


def _target(
    t: TargetSnapshot, now: float, gpus: tuple[GpuSample, ...], migs: tuple[MigSample, ...] = ()
) -> TargetDoc:
    s = t.state
    return {
        "target": t.info.name,
        "engine": t.info.engine,
        "deployment": t.info.deployment,
        "model": t.info.model,
        "phase": s.phase.value,
        "reason": s.reason,
        "since": s.phase_since,
        "phase_seconds": now - s.phase_since if s.phase_since is not None else None,
        "started_at": s.create_time,
        # A gone process's age would tick on forever: down, there is none.
        "elapsed_seconds": (
            now - s.create_time if s.create_time is not None and s.phase is not Phase.DOWN else None
        ),
        "ready": s.ready,
        "stalled": s.stalled,
        "stall_reason": s.stall_reason,
        "last_progress_at": s.last_progress_at,
        "last_evidence": s.last_evidence,
        "progress_ratio": s.progress_ratio,
        "shards": [{"key": k, "done": d, "total": n} for k, d, n in s.shard_progress],
        "eta_seconds": s.eta_seconds,
        "failure_reason": s.failure_reason.value if s.failure_reason else None,
        "reason_detail": s.reason_detail,
        "process": _process(t),
        "gpu_memory_bytes": {str(i): b for i, b in t.gpu_memory_bytes},
        "probes": {"health": _probe(s.last_health), "completion": _probe(s.last_completion)},
        "current_phases": _phases(s),
        "transitions": [transition_json(x) for x in s.transitions],
        "notable_lines": [_line(e) for e in s.notable_lines],
        "last_cold_start": _cold(s.last_cold_start),
        "last_wake": _wake(s),
        "loader": s.loader,
        "loader_bytes_per_second": s.loader_bytes_per_second,
        "download_bytes": s.download_bytes,
        "download_bytes_per_second": s.download_bytes_per_second,
        "orphaned_gpu_memory_bytes": {str(i): b for i, b in t.orphaned_gpu_memory_bytes},
        "engine_report": _engine_report(s),
        "startup_probe": _startup_probe(t.p95_start_seconds),
        "restarts": s.counters.restarts,
        "seconds_since_progress": s.seconds_since_progress,
        "timeline": _timeline(s, now),
        "previous_cold_start": _cold(_previous_start(t)),
        "typical_cold_start_seconds": t.typical_start_seconds,
        "gpu_memory": _gpu_memory(t, gpus),
        "mig_memory": _mig_memory(t, migs),
        "bounds": [phase_bound_doc(p) for p in t.verdicts.running],
        "last_start_bounds": [phase_bound_doc(p) for p in t.verdicts.last],
    }


def _timeline(s: TargetState, now: float) -> list[TimelineRowDoc]:
    """This cold start's startup phases in order, the running one measured up to ``now``."""
    done = dict(s.phase_seconds)
    rows: list[TimelineRowDoc] = []
    for phase in _TIMELINE_ORDER:
        seconds = done.get(phase)
        running = phase is s.phase and s.phase_since is not None
        if running:
            seconds = (seconds or 0.0) + max(0.0, now - (s.phase_since or now))
        if seconds is not None:
            rows.append({"phase": phase.value, "seconds": seconds, "running": running})
    return rows


def _previous_start(t: TargetSnapshot) -> ColdStart | None:
    """The newest finished cold start that is not the current one (for the comparison row)."""
    current = t.state.started_at
    for start in (*t.recent_starts, t.state.last_cold_start):
        if start is not None and start.started_at != current:
            return start
    return None


def _gpu_memory(t: TargetSnapshot, gpus: tuple[GpuSample, ...]) -> list[GpuMemoryDoc]:
    """Per GPU the target uses: its memory there and the card's total."""
    totals = {g.index: g.memory_total_bytes for g in gpus}
    return [
        {"gpu": i, "used_bytes": b, "total_bytes": totals.get(i)} for i, b in t.gpu_memory_bytes
    ]


def _mig_memory(t: TargetSnapshot, migs: tuple[MigSample, ...]) -> list[MigMemoryDoc]:
    """Per MIG slice the target runs on: its memory there, the slice's parent, id and size."""
    known = {m.uuid: m for m in migs}
    docs: list[MigMemoryDoc] = []
    for uuid, used in t.mig_memory_bytes:
        m = known.get(uuid)
        docs.append(
            {
                "mig_uuid": uuid,
                "gpu": None if m is None else m.gpu_index,
                "gpu_instance_id": None if m is None else m.gpu_instance_id,
                "profile": None if m is None else m.profile,
                "used_bytes": used,
                "total_bytes": None if m is None else m.memory_total_bytes,
            }
        )
    return docs


def _phases(s: TargetState) -> dict[str, float]:
    return {p.value: secs for p, secs in s.phase_seconds}


def _process(t: TargetSnapshot) -> ProcessDoc | None:
    p = t.process
    if p is None:
        return None
    return {
        "processes": p.process_count,
        "rss_bytes": p.rss_bytes,
        "cpu_seconds": p.cpu_seconds,
        "read_bytes": p.read_bytes,
        "read_bytes_error": p.read_bytes_error,
    }


def _probe(r: ProbeResult | None) -> ProbeDoc | None:
    if r is None:
        return None
    return {
        "outcome": r.outcome.value,
        "status_code": r.status_code,
        "duration_seconds": r.duration_seconds,
        "at": r.at,
        "loading": r.loading,
    }


def transition_json(x: Transition) -> TransitionDoc:
    """One phase change as JSON-ready data (shared with ``replay``)."""
    return {"at": x.at, "from": x.from_phase.value, "to": x.to_phase.value, "reason": x.reason}


def _line(e: LogEvent) -> LineDoc:
    return {"at": e.at, "class": e.cls.value, "text": e.text}


def _engine_report(s: TargetState) -> EngineReportDoc | None:
    r = s.engine_report
    if r is None:
        return None
    observed = observed_load_seconds(s)
    return {
        "load_seconds": r.load_seconds,
        "startup_seconds": r.startup_seconds,
        "steps": dict(r.steps),
        "models": [
            {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
            for m in r.models
        ],
        "observed_load_seconds": observed,
        "disagreement": load_disagreement(r.load_seconds, observed),
    }


def _startup_probe(p95: float | None) -> StartupProbeDoc | None:
    advice = startup_probe_advice(p95)
    if advice is None or p95 is None:
        return None
    period, threshold = advice
    return {"period_seconds": period, "failure_threshold": threshold, "p95_cold_start_seconds": p95}


def _wake(s: TargetState) -> WakeDoc | None:
    w = s.last_wake
    if w is None:
        return None
    return {
        "started_at": w.started_at,
        "ended_at": w.ended_at,
        "duration_seconds": w.duration_seconds,
        "wakes": s.counters.wakes.count,
    }


def _cold(c: ColdStart | None) -> ColdStartDoc | None:
    if c is None:
        return None
    return {
        "started_at": c.started_at,
        "ended_at": c.ended_at,
        "duration_seconds": c.duration_seconds,
        "outcome": c.outcome,
        "reason": c.reason,
        "phase_seconds": {p.value: s for p, s in c.phase_seconds},
        "read_bytes": c.read_bytes,
        "peak_gpu_bytes": c.peak_gpu_bytes,
    }


def probe_answer(snap: Snapshot | None, target: str) -> tuple[int, str]:
    """``/probe``'s answer for ``target``: 200 while its start progresses or it is up.

    503 once stalled, failed, down or degraded (``lifecycle.probe_verdict``), and before the
    first tick; 404 for a target the exporter does not watch. The line is for people.
    """
    if snap is None:
        return 503, "no sample yet"
    for t in snap.targets:
        if t.info.name == target:
            ok, why = probe_verdict(t.state)
            return (200 if ok else 503), f"{target} {why}"
    return 404, f"no target named {target!r}"
