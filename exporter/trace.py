"""Observations and thresholds <-> JSON lines, for ``record`` and ``replay``. No I/O.

A trace is one JSON object per line: ``{"kind": "tick", "now": ..., "thresholds": {...},
"observation": {...}}`` per target per tick. Log lines in a trace are already redacted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from exporter.core.lifecycle import Thresholds
from exporter.core.model import (
    FailureReason,
    LogClass,
    LogEvent,
    Observation,
    Phase,
    ProbeKind,
    ProbeOutcome,
    ProbeResult,
    ProcessSample,
)

TRACE_VERSION = 1


def observation_to_json(obs: Observation) -> dict[str, Any]:
    """An observation as JSON-ready data."""
    doc = asdict(obs)
    if obs.process is not None:
        doc["process"]["pids"] = list(obs.process.pids)
    doc["log_events"] = [asdict(e) for e in obs.log_events]
    return doc


def observation_from_json(doc: Mapping[str, Any]) -> Observation:
    """The inverse of ``observation_to_json``.

    Raises:
        ValueError: a field is missing or has the wrong shape.
    """
    try:
        return Observation(
            target=str(doc["target"]),
            at=float(doc["at"]),
            process=_process(doc.get("process")),
            process_error=doc.get("process_error"),
            health=_probe(doc.get("health")),
            completion=_probe(doc.get("completion")),
            disk_read_bytes=doc.get("disk_read_bytes"),
            gpu_memory_bytes=doc.get("gpu_memory_bytes"),
            log_events=tuple(_event(e) for e in doc.get("log_events", ())),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed observation: {exc}") from exc


def thresholds_to_json(th: Thresholds) -> dict[str, Any]:
    """Thresholds as JSON-ready data (phase-keyed maps become string-keyed)."""
    return {
        "stall_seconds": {p.value: s for p, s in th.stall_seconds.items()},
        "degraded_after": th.degraded_after,
        "weights_bytes": th.weights_bytes,
        "expected_peak_gpu_bytes": th.expected_peak_gpu_bytes,
        "expected_phase_seconds": {p.value: s for p, s in th.expected_phase_seconds.items()},
    }


def thresholds_from_json(doc: Mapping[str, Any]) -> Thresholds:
    """The inverse of ``thresholds_to_json``."""
    return Thresholds(
        stall_seconds={Phase(k): float(v) for k, v in doc["stall_seconds"].items()},
        degraded_after=int(doc["degraded_after"]),
        weights_bytes=doc.get("weights_bytes"),
        expected_peak_gpu_bytes=doc.get("expected_peak_gpu_bytes"),
        expected_phase_seconds={
            Phase(k): float(v) for k, v in doc.get("expected_phase_seconds", {}).items()
        },
    )


def _process(doc: Mapping[str, Any] | None) -> ProcessSample | None:
    if doc is None:
        return None
    return ProcessSample(**{**doc, "pids": tuple(doc["pids"])})


def _probe(doc: Mapping[str, Any] | None) -> ProbeResult | None:
    if doc is None:
        return None
    return ProbeResult(
        **{**doc, "kind": ProbeKind(doc["kind"]), "outcome": ProbeOutcome(doc["outcome"])}
    )


def _event(doc: Mapping[str, Any]) -> LogEvent:
    return LogEvent(
        **{
            **doc,
            "cls": LogClass(doc["cls"]),
            "phase": Phase(doc["phase"]) if doc.get("phase") else None,
            "progress": tuple(doc["progress"]) if doc.get("progress") else None,
            "fatal_reason": FailureReason(doc["fatal_reason"]) if doc.get("fatal_reason") else None,
        }
    )
