"""Sources do I/O and nothing else: each returns plain typed data and never raises.

``run_source`` wraps a sampling call the way node_exporter's ``execute()`` wraps a collector:
it times the call, turns any exception into a failed ``SourceStatus`` and logs only edges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from exporter.core.model import SourceStatus
from exporter.errors import SourceError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceResult(Generic[T]):
    """What one source call produced: the value (None when it failed) and its status."""

    value: T | None
    status: SourceStatus


class SourceHealth:
    """Remembers each source's last up/down state so only changes are logged."""

    def __init__(self) -> None:
        self._up: dict[tuple[str, str | None], bool] = {}

    def record(self, status: SourceStatus) -> None:
        """Log a WARNING when a source goes down and an INFO when it comes back."""
        key = (status.source, status.target)
        previous = self._up.get(key)
        self._up[key] = status.up
        if previous is None and status.up:
            return
        if previous is not False and not status.up:
            log.warning(
                "source down source=%s target=%s reason=%s",
                status.source,
                status.target or "-",
                status.error,
            )
        elif previous is False and status.up:
            log.info("source up source=%s target=%s", status.source, status.target or "-")


def run_source(
    name: str,
    call: Callable[[], T],
    *,
    target: str | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> SourceResult[T]:
    """Run one sampling call; any exception becomes a failed status with a bounded reason."""
    started = clock()
    try:
        value = call()
    except SourceError as exc:
        return SourceResult(None, SourceStatus(name, False, clock() - started, exc.reason, target))
    except Exception as exc:  # the wrapper is the one place that catches broadly
        log.debug("source raised source=%s target=%s", name, target or "-", exc_info=True)
        reason = type(exc).__name__
        return SourceResult(None, SourceStatus(name, False, clock() - started, reason, target))
    return SourceResult(value, SourceStatus(name, True, clock() - started, None, target))
