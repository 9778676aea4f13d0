"""Log profile data types and the helpers that build them.

No I/O. The classifier in ``exporter.core.classify`` applies these; engine modules and the shared
vocabulary (``exporter.engines.vocabulary``) only fill them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from exporter.base.model import FailureReason, LogClass, Phase


@dataclass(frozen=True, slots=True)
class LogPattern:
    """One tolerant regular expression and what a matching line means.

    Attributes:
        regex: compiled, case-insensitive; searched, never anchored (prefixes vary by rank).
        cls: the class a matching line gets.
        marker: short marker name ("weights_begin", "cuda_graph", "ready", ...); for
            progress patterns, the progress key ("shards", "cuda_graph").
        phase: the phase a marker announces, if any.
        fatal_reason: for fatal patterns, the failure reason.
        per_model: progress of one model's weights; a speculative draft model's second bar
            gets the key prefixed with ``draft:``. Progress regexes name the groups ``done``
            and ``total``.
    """

    regex: re.Pattern[str]
    cls: LogClass
    marker: str | None = None
    phase: Phase | None = None
    fatal_reason: FailureReason | None = None
    per_model: bool = False


def pattern(
    regex: str,
    cls: LogClass,
    *,
    marker: str | None = None,
    phase: Phase | None = None,
    fatal_reason: FailureReason | None = None,
    per_model: bool = False,
) -> LogPattern:
    """Build a LogPattern from a case-insensitive regular expression."""
    return LogPattern(re.compile(regex, re.IGNORECASE), cls, marker, phase, fatal_reason, per_model)


def marker(regex: str, name: str, phase: Phase | None = None) -> LogPattern:
    """A marker line: evidence of progress, optionally announcing a phase."""
    return pattern(regex, LogClass.MARKER, marker=name, phase=phase)


def progress(regex: str, key: str, phase: Phase | None, *, per_model: bool = False) -> LogPattern:
    """A progress bar line; the regex names the groups ``done`` and ``total``."""
    return pattern(regex, LogClass.PROGRESS, marker=key, phase=phase, per_model=per_model)


def fatal(regex: str, reason: FailureReason) -> LogPattern:
    """A line that ends the cold start with a failure reason."""
    return pattern(regex, LogClass.FATAL, fatal_reason=reason)


def benign(regex: str) -> LogPattern:
    """Known noise: counted, never notable, never progress evidence."""
    return pattern(regex, LogClass.BENIGN)


def wrapper(regex: str) -> LogPattern:
    """A line announcing a traceback whose final exception line is the real cause."""
    return pattern(regex, LogClass.ERROR, marker="traceback", fatal_reason=FailureReason.CRASH)


def loading_markers(*profiles: LogProfile) -> tuple[LogPattern, ...]:
    """The markers of engines another one runs inside it, less their ready lines.

    A host (KoboldCpp over llama.cpp, a serving framework over vLLM) prints its guest's load
    lines, but the host, not the guest, says when the server is ready.
    """
    return tuple(p for prof in profiles for p in prof.markers if p.phase is not Phase.READY)


class Matcher(Protocol):
    """A compiled pattern the classifier can search a line with.

    The config compiles user patterns with a linear-time engine (``exporter.config.UserRegex``),
    so a hostile line cannot make one backtrack for minutes; the core only searches.
    """

    def search(self, text: str) -> object | None:
        """A match object when the pattern occurs in text, else None."""
        ...


@dataclass(frozen=True, slots=True)
class LogPatterns:
    """User additions to an engine's log profile (compiled regular expressions from the config)."""

    benign: tuple[Matcher, ...] = ()
    fatal: tuple[Matcher, ...] = ()
    markers: tuple[Matcher, ...] = ()


@dataclass(frozen=True, slots=True)
class LogProfile:
    """An engine's markers, fatal patterns and benign noise, checked fatal, benign, marker.

    Attributes:
        markers: phase markers and progress bars.
        fatal: lines that end a cold start; checked oom first, then nccl, then the rest,
            before the shared vocabulary (a profile overrides it).
        benign: known noise that must never alarm anyone; shadows the shared fatal families.
        wrappers: lines such as "Scheduler hit an exception" whose traceback ends in the
            cause; that final exception line becomes fatal (crash unless it names oom/nccl).
        detect: lines that only this engine prints, for ``--engine auto``.
    """

    markers: tuple[LogPattern, ...] = field(default_factory=tuple)
    fatal: tuple[LogPattern, ...] = field(default_factory=tuple)
    benign: tuple[LogPattern, ...] = field(default_factory=tuple)
    wrappers: tuple[LogPattern, ...] = field(default_factory=tuple)
    detect: tuple[re.Pattern[str], ...] = field(default_factory=tuple)
