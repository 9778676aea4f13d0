"""How a wait ends: the exit codes, a target's verdict from its status document, the failure print.

Shared by both waits (daemon and standalone); pure but for :func:`fail`, which writes stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from exporter.base.controls import escape_controls
from exporter.base.units import format_duration
from exporter.commands.bounds import bound_line
from exporter.commands.text import Display, notable_lines
from exporter.render.status_doc import TargetDoc

EXIT_REACHED: Final = 0
EXIT_FAILED: Final = 1
EXIT_TIMEOUT: Final = 124
EXIT_INTERRUPTED: Final = 130
WANTED: Final[Mapping[str, frozenset[str]]] = {
    "ready": frozenset({"ready", "serving"}),
    "serving": frozenset({"serving"}),
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a wait ended: the exit code and the one-line summary to print."""

    code: int
    summary: str


def judge(doc: TargetDoc, until: str) -> Verdict | None:
    """The verdict a target's status document gives, or None to keep waiting."""
    name, phase = doc["target"], doc["phase"]
    took = format_duration(doc["elapsed_seconds"])
    if phase in WANTED[until]:
        summary = f"{name} is {phase} (cold start took {_start_took(doc)})"
        if bound := bound_line(doc):
            summary += f"; slowest phase {bound}"
        return Verdict(EXIT_REACHED, summary)
    if phase == "failed":
        why, reason = doc["failure_reason"] or "failed", doc["reason"]
        text = reason if why in reason else f"{why}: {reason}"
        if doc["reason_detail"]:
            text += f" ({doc['reason_detail']})"
        return Verdict(EXIT_FAILED, f"{name} failed after {took}: {text}")
    if doc["stalled"]:
        summary = f"{name} stalled in {phase} after {took}: {doc['stall_reason']}"
        if bound := bound_line(doc):
            summary += f"; {bound}"
        return Verdict(EXIT_FAILED, summary)
    return None


def _start_took(doc: TargetDoc) -> str:
    timeline = doc["timeline"]
    if timeline:
        return format_duration(sum(row["seconds"] for row in timeline))
    return "unknown: already up when the exporter started"


def fail(out: Display, verdict: Verdict, doc: TargetDoc | None = None) -> int:
    """Print a failed wait's summary and last notable log lines to stderr; returns its code."""
    out.close()
    print(escape_controls(verdict.summary), file=sys.stderr)
    lines = notable_lines(doc) if doc is not None else []
    if lines:
        print("last notable log lines:", file=sys.stderr)
        print("\n".join(escape_controls(line) for line in lines), file=sys.stderr)
    return verdict.code
