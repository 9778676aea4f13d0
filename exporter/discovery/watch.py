"""What the discovery clients share: their health, a bounded failure word, JSON lines.

Both the Kubernetes watcher and the Docker events follower read a long-lived HTTP stream of
one JSON document per line and report up/down the same way, so the daemon treats them alike.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Final, Generic, Protocol, TypeVar

import httpx

from exporter.base.watchdog import Watchdog

if TYPE_CHECKING:
    from exporter.discovery.pods import DiscoveredTarget

log = logging.getLogger(__name__)

MAX_REASON_CHARS: Final = 64
#: A node runs at most a few hundred pods or containers of some kB each; more is no list.
MAX_BODY_BYTES: Final = 64 << 20
#: One event is one object; etcd stores objects of at most 1.5 MiB, Docker's events are small.
MAX_LINE_BYTES: Final = 4 << 20
#: Seconds (or one read timeout, when shorter) a list+stream must last before its failure
#: counts as a new first one (the backoff starts over); one failing sooner keeps doubling it.
STEADY_SECONDS: Final = 10.0
#: The reason reported when a "list again now" failure repeats with nothing gained between.
ROUTINE_AGAIN: Final = "relist_loop"


class ApiError(Exception):
    """The API server's reply could not be used; ``reason`` is a short, bounded word."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason[:MAX_REASON_CHARS]


class StatusError(ApiError):
    """The server answered with a status other than 200."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class BoundedStreams:
    """GET requests whose whole body, however slowly it trickles, ends by a deadline.

    httpx bounds each read, not a request: a :class:`Watchdog` shuts the socket down at the
    deadline, and ``cut()`` does so at once (``close()`` of a watcher in another thread).
    ``reasons`` names the statuses worth a word of their own (else ``http_<code>``).
    """

    def __init__(
        self, client: httpx.Client, stop: threading.Event, reasons: Mapping[int, str]
    ) -> None:
        self._client, self._stop, self._reasons = client, stop, reasons
        self._dog: Watchdog | None = None  # the running request's

    def cut(self) -> None:
        """End the running request now."""
        if (dog := self._dog) is not None:
            dog.fire()

    def get(
        self,
        path: str,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        deadline: float,
    ) -> Generator[bytes, None, None]:
        """The body of ``GET path``, in chunks, within ``deadline`` (monotonic).

        Raises:
            StatusError: not a 200.
            ApiError: the deadline cut the body short, or it grew past ``MAX_BODY_BYTES``.
            httpx.HTTPError: the connection failed.
        """
        self._dog = dog = Watchdog(max(0.0, deadline - time.monotonic()))
        if self._stop.is_set():
            dog.fire()  # the watcher closed before this request's watchdog existed
        try:
            yield from self._stream(path, params, headers, dog)
        except httpx.HTTPError:
            if dog.fired:  # the read the watchdog cut short
                raise ApiError("deadline_exceeded") from None
            raise
        finally:
            dog.disarm()  # no-op when _stream did it
        if dog.fired:  # the stream ended early because the watchdog cut it
            raise ApiError("deadline_exceeded")

    def _stream(
        self,
        path: str,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        dog: Watchdog,
    ) -> Generator[bytes, None, None]:
        extensions = {"trace": dog.trace}
        with self._client.stream(
            "GET", path, params=params, headers=headers, extensions=extensions
        ) as reply:
            if reply.status_code != 200:
                code = reply.status_code
                raise StatusError(code, self._reasons.get(code, f"http_{code}"))
            total = 0
            try:
                for chunk in reply.iter_raw():
                    total += len(chunk)
                    if total > MAX_BODY_BYTES:
                        raise ApiError("body_too_large")
                    yield chunk
            finally:
                dog.disarm()  # before the connection goes back to the pool


@dataclass(frozen=True, slots=True)
class DiscoveryHealth:
    """How the watch goes: ``up`` after a list or watch succeeded, until one fails."""

    up: bool
    error: str | None
    synced: bool
    #: Targets found beyond ``max_targets`` or under a name taken already, left out.
    dropped: int = 0


class HealthTracker:
    """The last outcome of a discovery client's requests, logged once per change.

    ``where`` (e.g. ``node=n1``) goes into the "up" line; it must hold no secret.
    """

    def __init__(self, kind: str, where: str) -> None:
        self._kind, self._where = kind, where
        #: Replaced whole, never changed in place: readers in other threads see one or other.
        self.health = DiscoveryHealth(up=False, error="not_synced", synced=False)

    def succeeded(self) -> None:
        """A list, an inspect or an event arrived."""
        if not self.health.up:
            log.info("%s discovery up %s", self._kind, self._where)
        self.health = DiscoveryHealth(up=True, error=None, synced=True)

    def failed(self, reason: str) -> None:
        """A request failed for ``reason`` (a short word from ``reason_of``)."""
        if self.health.up or self.health.error != reason:
            log.warning("%s discovery down reason=%s", self._kind, reason)
        self.health = DiscoveryHealth(up=False, error=reason, synced=self.health.synced)


def reason_of(exc: Exception) -> str:
    """A short word for a failure: never the exception's text, which may carry a URL."""
    if isinstance(exc, ApiError):
        return exc.reason
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.HTTPError):
        return "http_error"
    if isinstance(exc, ValueError):
        return "bad_response"
    return "os_error" if isinstance(exc, OSError) else "internal_error"


def json_lines(chunks: Iterator[bytes], max_line: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Newline-separated events of a stream; each is a whole JSON document.

    Linear in the stream: each chunk is searched once, so a line that never ends costs its
    length, not its length squared.

    Raises:
        ApiError: a line grew past ``max_line`` bytes (``line_too_long``).
    """
    pending = bytearray()
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            start = end + 1
            if len(pending) > max_line:
                raise ApiError("line_too_long")
            line, pending = bytes(pending), bytearray()
            if line.strip():
                yield line
        pending += chunk[start:]
        if len(pending) > max_line:
            raise ApiError("line_too_long")
    if pending.strip():
        yield bytes(pending)


def json_object(data: bytes) -> Mapping[str, object]:
    """``data`` as a JSON object.

    Raises:
        ApiError: it is JSON but not an object.
        ValueError: it is not JSON.
    """
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ApiError("bad_response")
    return doc


Cursor = TypeVar("Cursor")


class ListWatcher(Generic[Cursor]):
    """A list, then a followed stream of changes, in a daemon thread; ``snapshot()`` reads it.

    The thread never delays the daemon's loop. ``_list`` replaces what is known and returns
    where changes start (a resourceVersion, a time); ``_follow`` applies one stream of them
    and returns where the next one starts. A failure the subclass calls ``_routine`` lists
    again at once; any other waits ``backoff`` seconds, doubled up to ``backoff_cap``, then
    lists again, so what changed while disconnected is read from the list. Only a stream
    that ends well, or a list+stream that lasted ``STEADY_SECONDS`` (or a read timeout),
    starts the backoff over: a routine failure again before that backs off too, and reports
    down.
    """

    kind: ClassVar[str]

    def __init__(
        self,
        client: httpx.Client,
        reasons: Mapping[int, str],
        where: str,
        *,
        read_seconds: float,
        backoff: float,
        backoff_cap: float,
        max_targets: int,
    ) -> None:
        self._read_seconds = read_seconds
        self._max_targets, self._dropped = max_targets, 0
        self._backoff, self._backoff_cap = backoff, backoff_cap
        #: Replaced whole, never changed in place: the daemon reads it from another thread.
        self._targets: tuple[DiscoveredTarget, ...] = ()
        self._tracker = HealthTracker(self.kind, where)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = client
        self._streams = BoundedStreams(client, self._stop, reasons)
        #: Lists done (the first, then one after each failure): tests and logs use it.
        self.lists = 0

    def start(self) -> None:
        """Start the watching thread."""
        self._thread = threading.Thread(target=self._run, name=self.kind, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching: the running request's socket is shut down, the thread joined."""
        self._stop.set()
        self._streams.cut()
        if self._thread is not None:
            self._thread.join(timeout=self._read_seconds + 1)
        self._client.close()

    def snapshot(self) -> tuple[DiscoveredTarget, ...]:
        """The targets found now (empty until the first list)."""
        return self._targets  # one reference read

    def health(self) -> DiscoveryHealth:
        """Whether the last request succeeded, and why not; how many targets were left out."""
        return replace(self._tracker.health, dropped=self._dropped)

    def _bounded(self, found: list[DiscoveredTarget]) -> tuple[DiscoveredTarget, ...]:
        """The found targets by name, one per name, at most ``max_targets``.

        A second target under a name (a template that does not tell them apart) and those
        past the cap are left out, counted in ``health().dropped``; logged when that begins.
        """
        named: dict[str, DiscoveredTarget] = {}
        for t in sorted(found, key=lambda t: t.target.name):
            named.setdefault(t.target.name, t)
        kept = tuple(named.values())[: self._max_targets]
        dropped = len(found) - len(kept)
        if dropped and not self._dropped:
            log.warning(
                "%s discovery left targets out dropped=%d max_targets=%d",
                self.kind,
                dropped,
                self._max_targets,
            )
        self._dropped = dropped
        return kept

    def _list(self) -> Cursor:
        raise NotImplementedError

    def _follow(self, cursor: Cursor) -> Cursor:
        raise NotImplementedError

    def _routine(self, exc: Exception) -> bool:
        """Whether ``exc`` only means "list again now" (no backoff, not down)."""
        return False

    def _run(self) -> None:
        # ``streak``: streams in a row that failed soon after a good list. A good list does
        # not start the backoff over, or a stream failing at once after each list would
        # relist every ``backoff`` seconds (at once when routine: a watch answering 410 Gone
        # to every fresh resourceVersion); so such a loop is down but for its lists.
        delay, streak = self._backoff, 0
        steady = min(STEADY_SECONDS, self._read_seconds)  # outlived a read timeout: no loop
        while not self._stop.is_set():
            listed: float | None = None
            try:
                self.lists += 1
                cursor = self._list()
                listed = time.monotonic()
                while not self._stop.is_set():
                    cursor = self._follow(cursor)
                    delay, streak = self._backoff, 0  # a whole stream went well
            except Exception as exc:  # the thread must outlive any reply; a bug is logged
                if self._stop.is_set():
                    return
                if listed is not None:
                    if time.monotonic() - listed >= steady:
                        delay, streak = self._backoff, 0
                    streak += 1
                routine = self._routine(exc)
                if routine and streak == 1:
                    continue
                if not routine and not isinstance(
                    exc, httpx.HTTPError | ApiError | OSError | ValueError
                ):
                    log.exception("%s discovery failed unexpectedly", self.kind)
                self._tracker.failed(ROUTINE_AGAIN if routine else reason_of(exc))
                self._stop.wait(delay)
                delay = min(self._backoff_cap, delay * 2)


class Discovery(Protocol):
    """What the daemon needs of a discovery client (Kubernetes pods, Docker containers)."""

    def snapshot(self) -> tuple[DiscoveredTarget, ...]:
        """The targets found now."""
        ...

    def health(self) -> DiscoveryHealth:
        """Whether the last request succeeded, and why not."""
        ...

    def close(self) -> None:
        """Stop the client's thread and release its connection."""
        ...
