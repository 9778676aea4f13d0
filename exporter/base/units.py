"""Durations, sizes and rates worded for people, the one way every layer prints them.

Pure text formatting; no I/O. ``wait``, ``status`` and the core's advice lines share it.
"""

from __future__ import annotations


def format_duration(seconds: float | None) -> str:
    """Compact human duration: ``42s``, ``10m40s``, ``2h05m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_bytes(n: float | None) -> str:
    """Binary units with one decimal: ``31.2 GiB``; ``-`` when unknown."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "GiB" and abs(value) >= 1024:
        return f"{value / 1024:.1f} TiB"
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def format_rate(bytes_per_second: float | None) -> str:
    """A transfer rate in binary units: ``1.1 GiB/s``; ``-`` when unknown."""
    return "-" if bytes_per_second is None else f"{format_bytes(bytes_per_second)}/s"
