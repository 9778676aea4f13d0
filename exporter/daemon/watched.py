"""One watched target on the shell's side: its sources, its core memory and its plan.

``TARGET_SOURCES`` is the registry of per-target sources: each line makes the source that
fills the ``TargetReadings`` field named after it (or None when the target has no such
thing), in sampling order, the process tree first. A new per-target source costs its
module, its field in ``TargetReadings``, one line here, and its use in the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

from exporter.base.model import ProbeResult
from exporter.config import Target
from exporter.core.observe import TargetReadings, TargetWorld, target_readings
from exporter.core.tick import TargetPlan
from exporter.sources import SourceResult, TargetSeen, TargetSource
from exporter.sources.logs import make_log_source
from exporter.sources.model_size import ModelSizeSource
from exporter.sources.probe import Prober
from exporter.sources.process import ProcessSource

#: Makes one per-target source from the target and the state directory; None: not for it.
SourceMaker = Callable[[Target, str], "TargetSource[object] | None"]

#: The per-target sources, in sampling order (the process tree must stay first).
TARGET_SOURCES: Final[tuple[SourceMaker, ...]] = (
    lambda target, _state: ProcessSource(target),
    lambda target, _state: Prober(target),
    make_log_source,
    lambda target, _state: (
        ModelSizeSource(target.name, target.model_path) if target.model_path else None
    ),
)


def make_sources(target: Target, state_directory: str) -> tuple[TargetSource[object], ...]:
    """The target's sources from the registry; those built are closed again if one fails.

    Raises:
        Exception: a source could not be built (e.g. a world-readable ``api_key_file``).
    """
    made: list[TargetSource[object]] = []
    try:
        for make in TARGET_SOURCES:
            if (source := make(target, state_directory)) is not None:
                made.append(source)
    except Exception:
        for source in made:
            source.close()
        raise
    return tuple(made)


@dataclass(eq=False)
class Watched:
    """A target's sources and its memory between ticks, owned by the loop thread.

    Attributes:
        target: its config.
        sources: its tick sources (``TARGET_SOURCES``), the process tree first; a shareable
            one may be held by other targets too (``daemon.shared``).
        world: its core-side memory, as the last tick left it.
        plan: what the core needs from config and history (refreshed after a finished start).
        seen: what the core made of it at the last tick, its sources' next input.
        completer: the completion prober, when the target has a completion probe.
    """

    target: Target
    sources: tuple[TargetSource[object], ...]
    world: TargetWorld
    plan: TargetPlan
    seen: TargetSeen = field(default_factory=TargetSeen)
    completer: Prober | None = None
    next_completion_at: float = 0.0
    completion: Future[ProbeResult] | None = None

    def readings(
        self, results: Sequence[SourceResult[object]], completion: ProbeResult | None
    ) -> TargetReadings:
        """Its sources' results of this tick as typed readings, each in its named field."""
        pairs = list(zip(self.sources, results, strict=True))
        return target_readings(
            {s.name: r.value for s, r in pairs},
            {s.name: r.status.error or "" for s, r in pairs if not r.status.up},
            completion,
        )

    def collect_completion(self) -> ProbeResult | None:
        """The finished completion probe's result, once."""
        if self.completion is None or not self.completion.done():
            return None
        result, self.completion = self.completion.result(), None
        return result

    def schedule_completion(self, pool: ThreadPoolExecutor, now: float) -> None:
        """Start a completion probe when one is due; it runs beside the loop, never in a tick."""
        due, completer = self.target.completion, self.completer
        if due is None or completer is None or self.completion is not None:
            return
        if self.world.state.ready and now >= self.next_completion_at:
            self.completion = pool.submit(completer.probe_completion)
            self.next_completion_at = now + due.interval_seconds

    def close_sources(self) -> list[TargetSource[object]]:
        """Every source it holds (the completer too), for the loop to close."""
        return [*self.sources, *((self.completer,) if self.completer else ())]
