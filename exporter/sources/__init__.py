"""Sources do I/O and nothing else: each returns a plain typed reading.

Every source keeps one contract (``Source``): a name (its ``source`` label) and
``sample(deadline)``. ``run_source`` wraps one call the way
node_exporter's ``execute()`` wraps a collector: it times it, turns any exception into a
failed ``SourceStatus`` (``SourceAbsent`` into an absent one, which is no failure) and logs
only edges. ``SourceRunner`` runs a tick's calls under one
deadline that the loop enforces, so a source that blocks is reported and the others still
count. A per-target source (``TargetSource``) also gets ``TargetSeen``: what the core made of
its target by the last tick, so it never needs core state pushed into it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import SourceStatus

T = TypeVar("T")
R_co = TypeVar("R_co", covariant=True)
log = logging.getLogger(__name__)

#: Bounded reason of a call that did not return within the tick's deadline.
DEADLINE_EXCEEDED: Final = "deadline_exceeded"
#: Bounded reason of a source skipped because its previous call has not returned yet.
STILL_RUNNING: Final = "still_running"


class Source(Protocol[R_co]):
    """What the loop samples once a tick.

    ``sample`` returns a plain typed reading (``exporter.base.model``) or raises; it should
    return by ``deadline`` (a ``time.monotonic()`` value). The loop enforces the deadline
    anyway: a call still running then is reported as failed and not started again until it
    returns.
    """

    @property
    def name(self) -> str:
        """The ``source`` label value, e.g. ``process`` or ``nvml``."""
        ...

    def sample(self, deadline: float) -> R_co:
        """One reading; raises ``SourceError`` (or anything) when the source is unusable."""
        ...

    def close(self) -> None:
        """Release files, sockets and child processes."""
        ...


@dataclass(frozen=True, slots=True)
class TargetSeen:
    """What the core made of a target by the last tick: the input of its sources' next sample.

    Attributes:
        at_rest: the server is ready, serving or asleep (no start in progress).
        starts_finished: cold starts the target finished since it was watched; a change
            says a start just ended (the model may have been replaced).
    """

    at_rest: bool = False
    starts_finished: int = 0


class TargetSource(Source[R_co], Protocol[R_co]):
    """A source about one target: ``sample`` also takes what the core last saw of it."""

    def sample(self, deadline: float, seen: TargetSeen | None = None) -> R_co:
        """One reading, given ``seen`` (None: nothing seen yet)."""
        ...


@dataclass(frozen=True, slots=True)
class SourceResult(Generic[T]):
    """What one source call produced: the value (None when it failed) and its status."""

    value: T | None
    status: SourceStatus


#: Reasons a source's first calls may give before it can say anything (a child still
#: starting): not logged as down for the first ``SETTLE_CALLS`` calls.
UNSETTLED: Final = frozenset({"starting", DEADLINE_EXCEEDED, STILL_RUNNING})
SETTLE_CALLS: Final = 10


class SourceHealth:
    """Remembers each source's last state (up, down, absent) so only changes are logged."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, str | None], str] = {}
        self._unsettled: dict[tuple[str, str | None], int] = {}

    def record(self, status: SourceStatus) -> None:
        """Log a WARNING when a source goes down, an INFO when it comes back or is absent."""
        key = (status.source, status.target)
        state = "absent" if status.absent else "up" if status.up else "down"
        previous = self._state.get(key)
        if state == previous or (previous is None and self._settling(key, status)):
            return
        if previous == "absent" and status.error in UNSETTLED:
            return  # a retry still starting says nothing new about an absent source
        self._state[key] = state
        where = (status.source, status.target or "-")
        if state == "absent":
            log.info(
                "source absent source=%s target=%s reason=%s hint=%s",
                *where,
                status.error,
                status.hint,
            )
        elif state == "down":
            log.warning("source down source=%s target=%s reason=%s", *where, status.error)
        elif previous is not None:
            log.info("source up source=%s target=%s", *where)

    def _settling(self, key: tuple[str, str | None], status: SourceStatus) -> bool:
        """True while a source not heard from yet is still starting (nothing to log)."""
        if status.up or status.error not in UNSETTLED:
            return False
        calls = self._unsettled[key] = self._unsettled.get(key, 0) + 1
        return calls <= SETTLE_CALLS


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
    except SourceAbsent as exc:
        took = clock() - started
        status = SourceStatus(name, False, took, exc.reason, target, absent=True, hint=exc.hint)
        return SourceResult(None, status)
    except SourceError as exc:
        return SourceResult(None, SourceStatus(name, False, clock() - started, exc.reason, target))
    except Exception as exc:  # the wrapper is the one place that catches broadly
        log.debug("source raised source=%s target=%s", name, target or "-", exc_info=True)
        reason = type(exc).__name__
        return SourceResult(None, SourceStatus(name, False, clock() - started, reason, target))
    return SourceResult(value, SourceStatus(name, True, clock() - started, None, target))


@dataclass(frozen=True, slots=True)
class SourceCall:
    """One source to sample this tick, for one target or (``target=None``) the host.

    ``sample`` is the call to make with the deadline when it is not ``source.sample`` itself
    (a per-target source's, given its ``TargetSeen``).
    """

    source: Source[object]
    target: str | None = None
    sample: Callable[[float], object] | None = None


#: A round's queue that has not moved for this long gets one more lane (thread).
SPILL_SECONDS: Final = 0.01


class _Slot:
    """One call's result, filled in by the lane that ran it (a plain slot: no Future's locks)."""

    __slots__ = ("call", "cancelled", "result")

    def __init__(self, call: SourceCall) -> None:
        self.call = call
        self.result: SourceResult[object] | None = None
        #: Never started: the round ended before a lane took it.
        self.cancelled = False


class _Round:
    """One ``run``'s calls, taken in order by the lanes that drain them."""

    def __init__(self, slots: list[_Slot], now: float) -> None:
        self._done = threading.Condition(threading.Lock())
        self._queue = deque(slots)
        self._pending = len(slots)
        self._moved_at = now
        self._closed = False

    def take(self, now: float) -> _Slot | None:
        """The next call for a lane to run, or None when the round is drained or over."""
        with self._done:
            if self._closed or not self._queue:
                return None
            self._moved_at = now
            return self._queue.popleft()

    def finish(self, slot: _Slot, result: SourceResult[object]) -> None:
        """Hand in one call's result; the last one wakes the loop."""
        slot.result = result
        with self._done:
            self._pending -= 1
            if not self._pending:
                self._done.notify()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for every call to finish; True once they all have."""
        with self._done:
            if self._pending:
                self._done.wait(timeout)
            return not self._pending

    def stuck_for(self, now: float) -> float:
        """How long calls have waited without a lane taking one (0 when none wait)."""
        with self._done:
            return now - self._moved_at if self._queue and not self._closed else 0.0

    def close(self) -> None:
        """End the round: the calls no lane took are cancelled, never to start."""
        with self._done:
            self._closed = True
            for slot in self._queue:
                slot.cancelled = True
            self._queue.clear()


class SourceRunner:
    """Samples a tick's sources under one deadline, on as few threads as keep them moving.

    A round's calls run in order on one lane (a pool thread); whenever the queue has not moved
    for ``spill_seconds`` (a call that waits on a slow server or blocks), one more lane takes
    it up, up to ``max_workers``. Calls that only read /proc or files thus run one after
    another: side by side, threads spent more CPU handing the GIL to each other than they
    saved (issue 18: half of a target's cost at 8 targets), while slow probes still overlap.

    A call that outlives the deadline keeps its thread (Python cannot stop it) but not the
    tick: it is reported as ``deadline_exceeded``, then ``still_running`` on later ticks until
    it returns, and is not started again meanwhile, so one stuck source costs one thread,
    never the loop. What it returns at last is the next tick's reading (a log source's lines
    are not lost). A call no lane reached by the deadline is ``deadline_exceeded`` and
    started afresh next tick.
    """

    def __init__(
        self,
        max_workers: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        spill_seconds: float = SPILL_SECONDS,
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sample")
        self._max_lanes = max_workers
        self._clock = clock
        self._spill = spill_seconds
        self._running: dict[int, _Slot] = {}

    def run(self, calls: Sequence[SourceCall], deadline: float) -> list[SourceResult[object]]:
        """Results in the order of ``calls``; every call gets one, by ``deadline``."""
        slots: list[_Slot | None] = []
        fresh: list[_Slot] = []
        for call in calls:
            late = self._running.get(id(call.source))
            if late is not None:  # a late call: its reading, when done, is this tick's
                slots.append(late if late.result is not None else None)
                continue
            slot = self._running[id(call.source)] = _Slot(call)
            slots.append(slot)
            fresh.append(slot)
        if fresh:
            self._drive(_Round(fresh, self._clock()), deadline)
        return [self._result(call, s) for call, s in zip(calls, slots, strict=True)]

    def _drive(self, rnd: _Round, deadline: float) -> None:
        """Run the round's lanes until every call is done or the deadline passes."""
        self._pool.submit(self._lane, rnd, deadline)
        lanes = 1
        while (remaining := deadline - self._clock()) > 0:
            if rnd.wait(min(self._spill, remaining)):
                break
            if lanes < self._max_lanes and rnd.stuck_for(self._clock()) >= self._spill:
                self._pool.submit(self._lane, rnd, deadline)
                lanes += 1
        rnd.close()

    def _lane(self, rnd: _Round, deadline: float) -> None:
        while (slot := rnd.take(self._clock())) is not None:
            call = slot.call
            sample = functools.partial(call.sample or call.source.sample, deadline)
            rnd.finish(slot, run_source(call.source.name, sample, target=call.target))

    def _result(self, call: SourceCall, slot: _Slot | None) -> SourceResult[object]:
        if slot is not None and (slot.result is not None or slot.cancelled):
            self._running.pop(id(call.source), None)
            if slot.result is not None:
                return slot.result
        reason = STILL_RUNNING if slot is None else DEADLINE_EXCEEDED
        status = SourceStatus(call.source.name, False, 0.0, reason, call.target)
        return SourceResult(None, status)

    def forget(self, source: Source[object]) -> None:
        """Drop what is known of a source that is closed (a target removed on reload)."""
        self._running.pop(id(source), None)

    def close(self) -> None:
        """Stop the pool; calls still running are abandoned, not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def stuck(self) -> int:
        """Calls that have not returned: their threads would hold up the interpreter's exit."""
        return sum(s.result is None and not s.cancelled for s in self._running.values())
