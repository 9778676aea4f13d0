"""The ``/trail`` document: each target's current and previous start, drawn by the page.

No I/O: rendered from the snapshot's trails. Compact on purpose (arrays, not objects per
point): 64 targets with two 600-point starts each stay in the low megabytes.
"""

from __future__ import annotations

import json

from exporter.core.snapshot import Snapshot, TargetSnapshot
from exporter.core.trail import Trail


def trail_json(snap: Snapshot | None) -> bytes:
    """The document as UTF-8 JSON; before the first tick, no targets."""
    doc: dict[str, object] = {"taken_at": None, "targets": []}
    if snap is not None:
        doc = {"taken_at": snap.taken_at, "targets": [_target(t) for t in snap.targets]}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _target(t: TargetSnapshot) -> dict[str, object]:
    return {
        "target": t.info.name,
        "phase": t.state.phase.value,
        "stalled": t.state.stalled,
        "stall_threshold_seconds": t.stall_threshold_seconds,
        "current": _trail(t.trails.current),
        "previous": _trail(t.trails.previous),
    }


def _trail(trail: Trail | None) -> dict[str, object] | None:
    if trail is None:
        return None
    n = len(trail.gpus)
    return {
        "started_at": trail.started_at,
        "stride": trail.stride,
        "gpus": list(trail.gpus),
        #: [t, read B/s, RSS B, CPU cores, seconds since progress, bytes on each GPU...]
        "points": [[_rounded(v) for v in row[: 5 + n]] for row in trail.rows()],
        "marks": [[m.t, m.kind, m.text] for m in trail.marks],
        "bands": [[t, phase] for t, phase in trail.bands],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
