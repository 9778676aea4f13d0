"""How the commands speak: compact durations and sizes, bars, sparklines, the live line.

Pure formatting of a target's status document (shared by ``wait`` and ``status``), and the
display that keeps one live line redrawn in place on a terminal.
"""

from __future__ import annotations

import shutil
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TextIO

from exporter.base.controls import escape_controls
from exporter.base.units import format_bytes, format_duration
from exporter.render.status_doc import TargetDoc

NOTABLE_SHOWN: Final = 5
#: Sparkline levels, lowest first; the ASCII set for terminals that cannot show blocks.
SPARKS: Final = "▁▂▃▄▅▆▇█"
ASCII_SPARKS: Final = "_.-=+*#@"
#: Polls a sparkline shows (one character each).
SPARK_WIDTH: Final = 16


def eta_text(doc: TargetDoc) -> str:
    """``ETA 1m05s · usually ready in 10m40s`` from a target's status document."""
    parts = []
    if doc["eta_seconds"] is not None:
        parts.append(f"ETA {format_duration(doc['eta_seconds'])}")
    typical = doc["typical_cold_start_seconds"]
    previous = doc["previous_cold_start"]
    if typical is not None:
        parts.append(f"usually ready in {format_duration(typical)}")
    elif previous is not None and previous["outcome"] == "ready":
        parts.append(f"last start took {format_duration(previous['duration_seconds'])}")
    return " · ".join(parts)


def progress_bar(ratio: float | None, width: int, *, unicode: bool = True) -> str:
    """A fixed-width text bar; an unknown ratio draws an empty bar."""
    full, empty = ("█", "░") if unicode else ("#", "-")
    filled = round(max(0.0, min(1.0, ratio or 0.0)) * width)
    return full * filled + empty * (width - filled)


def gpu_text(doc: TargetDoc) -> str:
    """``GPU 2x 31.2 GiB``: the GPUs holding this target's memory, and the mean per GPU."""
    used = [g["used_bytes"] for g in doc["gpu_memory"] if g["used_bytes"]]
    if not used:
        return ""
    return f"GPU {len(used)}x {format_bytes(sum(used) / len(used))}"


def phase_label(doc: TargetDoc) -> str:
    """The phase, with ``(stalled)`` when the stall flag is up."""
    return doc["phase"] + (" (stalled)" if doc["stalled"] else "")


def notable_lines(doc: TargetDoc, limit: int = NOTABLE_SHOWN) -> list[str]:
    """The last notable log lines, benign noise dropped, as ``HH:MM:SS class text``."""
    lines = [e for e in doc["notable_lines"] if e["class"] != "benign"]
    return [
        f"  {time.strftime('%H:%M:%S', time.localtime(e['at']))}  {e['class']:<7} {e['text']}"
        for e in lines[-limit:]
    ]


def change_line(doc: TargetDoc) -> str:
    """The line printed when a target's phase changes: ``[   52s] demo ready: reason``."""
    since, started = doc["since"], doc["started_at"]
    at = max(0.0, since - started) if since is not None and started is not None else None
    line = f"[{format_duration(at):>6}] {doc['target']} {phase_label(doc)}: {doc['reason']}"
    if doc["stalled"] and doc["stall_reason"]:
        line += f" ({doc['stall_reason']})"
    return line


def sparkline(values: Sequence[float | None], *, unicode: bool = True) -> str:
    """One character per value, scaled to the largest; an unknown value is a blank."""
    levels = SPARKS if unicode else ASCII_SPARKS
    top = max((v for v in values if v is not None), default=0.0)
    if top <= 0:
        return ""
    step = len(levels) - 1
    return "".join(" " if v is None else levels[round(v / top * step)] for v in values)


@dataclass
class Recent:
    """The last ``SPARK_WIDTH`` polls' GPU memory and read rate, for the live sparklines."""

    gpu: deque[float | None] = field(default_factory=lambda: deque(maxlen=SPARK_WIDTH))
    read: deque[float | None] = field(default_factory=lambda: deque(maxlen=SPARK_WIDTH))

    def add(self, doc: TargetDoc, read_rate: float | None) -> None:
        """Note one poll."""
        used = [g["used_bytes"] for g in doc["gpu_memory"] if g["used_bytes"]]
        self.gpu.append(float(sum(used)) if used else None)
        self.read.append(read_rate)


def live_line(
    doc: TargetDoc,
    read_rate: float | None,
    *,
    unicode: bool = True,
    recent: Recent | None = None,
) -> str:
    """The terminal's live line: phase, bar, progress, elapsed, GPU memory, read rate, ETA.

    With ``recent``, GPU memory and the read rate each get a sparkline of the last polls.
    """
    ratio = doc["progress_ratio"]
    gpu_spark = sparkline(recent.gpu, unicode=unicode) if recent else ""
    read_spark = sparkline(recent.read, unicode=unicode) if recent else ""
    parts = [
        f"{doc['target']} {phase_label(doc)}",
        progress_bar(ratio, 20, unicode=unicode),
        f"{ratio:.0%}" if ratio is not None else "",
        format_duration(doc["elapsed_seconds"]),
        " ".join(p for p in (gpu_text(doc), gpu_spark) if p),
        f"read {format_bytes(read_rate)}/s {read_spark}".rstrip() if read_rate else "",
        eta_text(doc),
    ]
    text = "  ".join(p for p in parts if p)
    return text if unicode else text.replace("·", "-")


# --- output ---------------------------------------------------------------------------------


class Display:
    """Permanent lines for changes; on a terminal also one live line redrawn in place.

    What it prints holds names and engine text: control characters in them are escaped, so
    only the display's own sequences reach the terminal.
    """

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.tty = out.isatty()
        self.unicode = can_encode(out, "█░·")
        self._live = False

    def line(self, text: str) -> None:
        """Print a permanent line (above the live one on a terminal)."""
        self._clear()
        print(escape_controls(text), file=self._out, flush=True)

    def live(self, text: str) -> None:
        """Redraw the live line (terminal only), cut to the terminal's width."""
        if not self.tty:
            return
        width = shutil.get_terminal_size((100, 24)).columns - 1
        self._out.write("\r\x1b[K" + escape_controls(text)[:width])
        self._out.flush()
        self._live = True

    def close(self) -> None:
        """Remove the live line, leaving the cursor at the start of an empty line."""
        self._clear()

    def _clear(self) -> None:
        if self._live:
            self._out.write("\r\x1b[K")
            self._out.flush()
            self._live = False


def can_encode(out: TextIO, text: str) -> bool:
    """True when ``out`` can show ``text`` in its encoding (else the ASCII forms are used)."""
    try:
        text.encode(getattr(out, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True
