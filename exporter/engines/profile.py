"""Log profile data types: what an engine prints while it cold-starts, as data.

No I/O. The classifier in ``exporter.logparse`` applies these; engine modules only fill them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from exporter.model import FailureReason, LogClass, Phase


@dataclass(frozen=True, slots=True)
class LogPattern:
    """One tolerant regular expression and what a matching line means.

    Attributes:
        regex: compiled, case-insensitive; searched, never anchored (prefixes vary by rank).
        cls: the class a matching line gets.
        marker: short marker name ("weights_begin", "cuda_graph", "ready", ...).
        phase: the phase a marker announces, if any.
        fatal_reason: for fatal patterns, the failure reason.
    """

    regex: re.Pattern[str]
    cls: LogClass
    marker: str | None = None
    phase: Phase | None = None
    fatal_reason: FailureReason | None = None


def pattern(
    regex: str,
    cls: LogClass,
    *,
    marker: str | None = None,
    phase: Phase | None = None,
    fatal_reason: FailureReason | None = None,
) -> LogPattern:
    """Build a LogPattern from a case-insensitive regular expression."""
    return LogPattern(re.compile(regex, re.IGNORECASE), cls, marker, phase, fatal_reason)


@dataclass(frozen=True, slots=True)
class LogProfile:
    """An engine's markers, fatal patterns and benign noise, checked fatal, benign, marker."""

    markers: tuple[LogPattern, ...] = field(default_factory=tuple)
    fatal: tuple[LogPattern, ...] = field(default_factory=tuple)
    benign: tuple[LogPattern, ...] = field(default_factory=tuple)
