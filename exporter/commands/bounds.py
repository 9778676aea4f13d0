"""The one advice line ``status`` and ``wait`` print: what bounds (or bounded) a start.

Reads the ``/status`` document only (``bounds``, ``last_start_bounds``); no I/O.
"""

from __future__ import annotations

from exporter.render.status_doc import TargetDoc


def bound_line(doc: TargetDoc) -> str | None:
    """The running phase's advice, else the last finished start's slowest phase's; None if none.

    The slowest phase is where the time went, so it is the one worth acting on.
    """
    running = [b for b in doc.get("bounds", []) if b["running"]]
    if running:
        return running[-1]["advice"]
    last = doc.get("last_start_bounds", [])
    if not last:
        return None
    return max(last, key=lambda b: b["seconds"])["advice"]
