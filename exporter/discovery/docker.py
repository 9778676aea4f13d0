"""A client of the Docker Engine API on its unix socket: labelled containers, followed by events.

Podman's socket (``/run/podman/podman.sock``) speaks the same API. Read-only calls only:
``GET /containers/json`` (filtered by the engine label), ``GET /containers/{id}/json`` and
``GET /events``. Never logs a container ID, an IP, a command line or a response body.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import Mapping
from typing import Final

import httpx

from exporter.base.errors import ConfigError
from exporter.config import DockerDiscovery
from exporter.discovery.containers import ENGINE_LABEL, target_from_container
from exporter.discovery.pods import field_obj, field_str
from exporter.discovery.watch import (
    ApiError,
    ListWatcher,
    StatusError,
    json_lines,
    json_object,
    reason_of,
)

log = logging.getLogger(__name__)

#: Seconds one events request covers (``until``); the next resumes where it ended.
DEFAULT_EVENTS_SECONDS: Final = 300
#: Seconds a list or an inspect may take before the daemon counts as stuck.
DEFAULT_READ_SECONDS: Final = 30.0
#: Seconds one container's inspect may take: one hanging container must not hold up the rest.
DEFAULT_INSPECT_SECONDS: Final = 5.0
_NOT_FOUND: Final = 404
#: The actions that change what a container is: anything else (exec, health) is noise.
#: ``kill`` is not an end (``docker kill -s HUP`` leaves it running) and a paused engine is
#: still a target (frozen, so its stall is what should show); ``stop`` is followed by ``die``.
_STARTED: Final = frozenset({"start", "restart"})
_ENDED: Final = frozenset({"die", "destroy"})
_EVENT_FILTERS: Final = json.dumps({"type": ["container"]})
_LIST_FILTERS: Final = json.dumps({"label": [ENGINE_LABEL]})
_STATUS_REASONS: Final[Mapping[int, str]] = {403: "forbidden", 500: "daemon_error"}


def socket_problem(settings: DockerDiscovery, path: str, environment: bool) -> str | None:
    """Why ``[discovery.docker] socket`` cannot be the Engine API, as one config line; or None.

    Something else at the path is a mistake ``run`` refuses; nothing there (the Docker
    daemon not started yet) only ``check-config`` reports (``environment``): ``run`` retries.
    """
    where = "discovery.docker.socket"
    try:
        mode = os.stat(settings.socket).st_mode
    except FileNotFoundError:
        missing = ConfigError(path, where, "does not exist (is the Docker daemon running?)")
        return str(missing) if environment else None
    except OSError as exc:
        return str(ConfigError(path, where, f"cannot be read: {exc.strerror}"))
    return None if stat.S_ISSOCK(mode) else str(ConfigError(path, where, "is not a unix socket"))


class ContainerWatcher(ListWatcher[int]):
    """Lists the labelled containers, then follows the daemon's events; keeps ``snapshot()``.

    Runs in its own daemon thread (``start``), like the Kubernetes watcher, and answers the
    same ``snapshot()``/``health()``. Docker's events stream is silent while nothing happens,
    so each request asks for a window (``since``/``until``) and ends on its own; the next one
    starts where it ended, so no event is lost. Any failure (a dropped stream, a daemon
    restart) waits ``backoff`` seconds, doubled up to ``backoff_cap``, then lists again:
    what happened while disconnected is read from the list, not from events.
    """

    kind = "docker"

    def __init__(
        self,
        settings: DockerDiscovery,
        *,
        events_seconds: int = DEFAULT_EVENTS_SECONDS,
        read_seconds: float = DEFAULT_READ_SECONDS,
        inspect_seconds: float = DEFAULT_INSPECT_SECONDS,
        backoff: float = 1.0,
        backoff_cap: float = 60.0,
    ) -> None:
        client = httpx.Client(
            # The host part is a placeholder: the transport connects to the socket.
            base_url="http://docker",
            transport=httpx.HTTPTransport(uds=settings.socket),
            trust_env=False,
            timeout=httpx.Timeout(read_seconds, connect=min(5.0, read_seconds)),
        )
        super().__init__(
            client,
            _STATUS_REASONS,
            "socket=local",
            read_seconds=read_seconds,
            backoff=backoff,
            backoff_cap=backoff_cap,
            max_targets=settings.max_targets,
        )
        self._settings = settings
        self._events_seconds = events_seconds
        self._inspect_seconds = min(inspect_seconds, read_seconds)
        self._containers: dict[str, Mapping[str, object]] = {}
        #: Containers whose inspect failed: tried again before each events window.
        self._unread: set[str] = set()

    def _list(self) -> int:
        """Replace the containers with a fresh list; returns when (Unix seconds) it began."""
        if not os.path.exists(self._settings.socket):
            # httpcore leaks the socket of a failed unix connect; no daemon yet is the usual
            # case (the exporter started first), so it is told apart before connecting.
            raise ApiError("no_socket")
        # Events from this second on are read next: one seen twice is harmless (an inspect).
        began = int(time.time())
        listed = self._get("/containers/json", {"filters": _LIST_FILTERS})
        if not isinstance(listed, list):
            raise ApiError("bad_response")
        ids = [i for c in listed if isinstance(c, Mapping) and (i := field_str(c, "Id"))]
        before, self._containers, self._unread = self._containers, {}, set()
        for container_id in ids:
            self._read(container_id, before.get(container_id))
        self._publish()
        self._tracker.succeeded()
        return began

    def _read(self, container_id: str, known: Mapping[str, object] | None) -> None:
        """Inspect one container into ``_containers``; a failure keeps what was ``known``.

        A container whose inspect hangs or fails is skipped (and retried later), so the
        others are still found; only a failed connection (the daemon gone) ends the list.
        """
        try:
            inspected = self._inspect(container_id)
        except (ApiError, ValueError) as exc:
            if self._stop.is_set():
                raise  # cut by close(): the events stream it interrupted ends too
            if container_id not in self._unread:
                log.warning("docker inspect failed reason=%s, others go on", reason_of(exc))
            self._unread.add(container_id)
            inspected = known
        else:
            self._unread.discard(container_id)
        if inspected is not None:
            self._containers = {**self._containers, container_id: inspected}
        elif container_id in self._containers:
            self._containers = {k: v for k, v in self._containers.items() if k != container_id}

    def _retry_unread(self) -> None:
        """Inspect again the containers whose inspect failed."""
        if self._unread:
            for container_id in sorted(self._unread):
                self._read(container_id, self._containers.get(container_id))
            self._publish()

    def _follow(self, since: int) -> int:
        """Apply events from ``since`` for one window; returns where the next one starts."""
        self._retry_unread()
        until = int(time.time()) + self._events_seconds
        params = {"filters": _EVENT_FILTERS, "since": str(since), "until": str(until)}
        deadline = time.monotonic() + (until - time.time()) + self._read_seconds
        with contextlib.closing(self._streams.get("/events", params, {}, deadline)) as chunks:
            for line in json_lines(chunks):
                self._apply(json_object(line))
                self._tracker.succeeded()
        if time.time() < until - 1:
            # Docker ends a window at ``until`` only; earlier, the daemon went away.
            raise ApiError("events_ended_early")
        return until

    def _apply(self, event: Mapping[str, object]) -> None:
        """One container event: inspect a started one, forget an ended one."""
        action = field_str(event, "Action") or field_str(event, "status")
        actor = field_obj(event, "Actor")
        container_id = field_str(actor, "ID") or field_str(event, "id")
        if not container_id:
            return
        if action in _STARTED:
            if ENGINE_LABEL not in field_obj(actor, "Attributes"):
                return  # the event carries the labels: an unlabelled one needs no inspect
            self._read(container_id, self._containers.get(container_id))
        elif action in _ENDED and (
            container_id in self._containers or container_id in self._unread
        ):
            self._unread.discard(container_id)
            self._containers = {k: v for k, v in self._containers.items() if k != container_id}
        else:
            return
        self._publish()

    def _inspect(self, container_id: str) -> Mapping[str, object] | None:
        """``GET /containers/{id}/json``; None when it is gone already."""
        try:
            doc = self._get(f"/containers/{container_id}/json", {}, self._inspect_seconds)
        except StatusError as exc:
            if exc.status == _NOT_FOUND:
                return None  # removed between its event (or the list) and now
            raise
        if not isinstance(doc, Mapping):
            raise ApiError("bad_response")
        return doc

    def _get(self, path: str, params: Mapping[str, str], seconds: float | None = None) -> object:
        deadline = time.monotonic() + (self._read_seconds if seconds is None else seconds)
        with contextlib.closing(self._streams.get(path, params, {}, deadline)) as body:
            return json.loads(b"".join(body))

    def _publish(self) -> None:
        """Recompute the targets after each change (this thread only)."""
        found = [
            t
            for c in self._containers.values()
            if (t := target_from_container(c, self._settings)) is not None
        ]
        self._targets = self._bounded(found)
