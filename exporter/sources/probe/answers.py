"""What an engine's answer means: loading, asleep, a real completion, and a probe's outcome.

Pure: a status and a body in, a verdict out. Beside ``reports``, which reads what engines say
of their own startup.
"""

from __future__ import annotations

import json
from typing import Any

from exporter.base.model import ProbeKind, ProbeOutcome, ProbeResult
from exporter.sources.probe.client import Reply, body_ignored


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both derive from it
        return None


def says_loading(status: int, body: bytes) -> bool:
    """True when a reply says the engine is still loading its model.

    llama.cpp answers ``503 {"error":{"message":"Loading model",...}}``; builds from 2024
    answered ``503 {"status": "loading model"}`` (ENGINES.md section 3, REAL-ENGINES.md 4).
    """
    data = _json(body) if status == 503 else None
    if not isinstance(data, dict):
        return False
    error = data.get("error")
    texts = (error.get("message") if isinstance(error, dict) else None, data.get("status"))
    return any(isinstance(t, str) and "loading" in t.lower() for t in texts)


def says_sleeping(status: int, body: bytes) -> bool | None:
    """The sleep state in a ``/is_sleeping`` reply (vLLM: ``{"is_sleeping": true}``), else None."""
    data = _json(body) if 200 <= status < 300 else None
    value = data.get("is_sleeping") if isinstance(data, dict) else None
    return value if isinstance(value, bool) else None


def has_choices(body: bytes) -> bool:
    """True when a completion reply is JSON with a non-empty ``choices`` list."""
    data = _json(body)
    return (
        isinstance(data, dict) and isinstance(data.get("choices"), list) and bool(data["choices"])
    )


def judge(kind: ProbeKind, reply: Reply) -> ProbeResult:
    """Outcome of a complete response; ``at`` and duration are filled in by the caller."""
    status = reply.status or 0
    choices = False
    loading = False
    if body_ignored(status):
        outcome = ProbeOutcome.REDIRECT if status < 400 else ProbeOutcome.UNAUTHORIZED
    elif not 200 <= status < 300:
        outcome = ProbeOutcome.HTTP_STATUS
        loading = says_loading(status, reply.body)
    elif kind is ProbeKind.HEALTH:
        outcome = ProbeOutcome.OK  # vLLM answers 200 with an empty body
    else:
        choices = has_choices(reply.body)
        outcome = ProbeOutcome.OK if choices else ProbeOutcome.BAD_BODY
    return ProbeResult(kind, outcome, reply.status, 0.0, 0.0, has_choices=choices, loading=loading)
