"""What an engine's failure lines tell: which reason wins, the detail people read, tracebacks.

No I/O. The classifier (``core.classify``) applies these; the lifecycle quotes the
decisive line through ``reason_detail``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Final

from exporter.base.model import FailureReason, LogEvent

#: Lines after a traceback header within which its final exception line is awaited.
TRACEBACK_BUDGET: Final = 200

TRACEBACK_HEAD = re.compile(r"Traceback \(most recent call last\)")
TRACEBACK_BODY = re.compile(r"^\s+\S|\bFile \"[^\"]+\", line \d+")
# The interpreter's top frame: a traceback through it is an uncaught exception ending the
# process (tgi-14-crash), unlike a handled request error logged with its traceback
# (vllm-19-ready, lmdeploy-01-ready).
TOP_FRAME = re.compile(r"\bFile \"[^\"]+\", line \d+, in <module>")
# A frame in the interpreter's own format: with no header open, an excerpt cut inside a
# traceback (vllm-36-crash) whose exception line is all the cause it shows.
FRAME = re.compile(r"^\W{0,4}File \"[^\"]+\", line \d+, in \S")
EXCEPTION = re.compile(
    r"(?:^|[\]\)]\s)\s*(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Exited))(?::\s|\s*$)"
)
NOT_A_CRASH = re.compile(r"KeyboardInterrupt|SystemExit|CancelledError|EngineDeadError")
#: Precedence of reasons named on one line or in one traceback: the most specific first; a
#: kill from outside (SIGKILL) says more than the supervisor's "crashed" or "exited" around it.
REASON_ORDER: Final[dict[FailureReason | None, int]] = {
    FailureReason.OOM: 0,
    FailureReason.NCCL: 1,
    FailureReason.KILLED: 2,
}
#: Characters of the decisive line kept in a reason detail.
DETAIL_CHARS: Final = 200


def stronger(a: FailureReason, b: FailureReason | None) -> FailureReason:
    """The reason that takes precedence: oom, then nccl, then the rest (``a`` on a tie)."""
    if b is not None and REASON_ORDER.get(b, 9) < REASON_ORDER.get(a, 9):
        return b
    return a


def reason_detail(event: LogEvent, tz: tzinfo = UTC) -> str:
    """The decisive line of a failure, cut, with its line number or its time in ``tz``.

    Meant for people (``/status``, the page, ``wait``), never for a metric label. The event's
    text was redacted when it was classified.
    """
    where = (
        f"line {event.line_no}"
        if event.line_no is not None
        else datetime.fromtimestamp(event.at, tz).isoformat(sep=" ", timespec="seconds")
    )
    text = " ".join(event.text.split())
    if len(text) > DETAIL_CHARS:
        text = text[: DETAIL_CHARS - 1] + "\u2026"
    return f"{where}: {text}"


def infer_reason(text: str) -> FailureReason:
    """The failure reason a fatal line implies when no pattern named one (user patterns)."""
    if re.search(r"out of memory|OutOfMemory|\boom\b", text, re.I):
        return FailureReason.OOM
    if re.search(r"\bnccl", text, re.I):
        return FailureReason.NCCL
    return FailureReason.CRASH


@dataclass(slots=True)
class OpenTraceback:
    """An open Python traceback: awaiting its final exception line.

    ``fatal``: a wrapper announced it, or it reached the interpreter's top frame.
    ``hint``: a reason its frames named (the cause chain, not only the last line).
    ``opener``: the wrapper line; it becomes the fatal line when no exception line follows
    (an excerpt cut inside the traceback, sglang-17-crash; a traceback abandoned).
    ``headless``: opened by a bare frame (an excerpt that starts inside the traceback); it
    ends at the first line that is neither frame, source nor exception.
    """

    fatal: bool
    budget: int = TRACEBACK_BUDGET
    hint: FailureReason | None = None
    opener: LogEvent | None = None
    headless: bool = False
