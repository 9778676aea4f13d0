"""Plain records of cold starts that history stores and every layer reads.

They sit apart from the state machine (``exporter.core.lifecycle``) so the store and the
renderers read a finished start without importing the lifecycle's logic.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from exporter.base.model import STARTUP_PHASES, Phase


@dataclass(frozen=True, slots=True)
class Transition:
    """One phase change and the evidence behind it."""

    at: float
    from_phase: Phase
    to_phase: Phase
    reason: str


class StartOutcome(enum.StrEnum):
    """How a cold start ended; the value is what history stores and ``/status`` shows."""

    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ColdStart:
    """A finished cold start (ready or failed): what history stores and ``/status`` shows."""

    started_at: float
    ended_at: float
    outcome: StartOutcome
    reason: str | None
    phase_seconds: tuple[tuple[Phase, float], ...]
    longest_quiet_seconds: tuple[tuple[Phase, float], ...]
    read_bytes: int | None
    peak_gpu_bytes: int | None

    @property
    def duration_seconds(self) -> float:
        """From process start to ready (or to failure)."""
        return self.ended_at - self.started_at


@dataclass(frozen=True, slots=True)
class SavedStart:
    """What history keeps of a cold start in progress, so a restarted exporter resumes it."""

    target: str
    pid: int
    create_time: float
    phase: Phase
    phase_since: float | None
    phase_seconds: tuple[tuple[Phase, float], ...]
    progress_ratio: float | None

    @property
    def in_progress(self) -> bool:
        """The start had not finished: worth keeping across an exporter restart."""
        return self.phase in STARTUP_PHASES
