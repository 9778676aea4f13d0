"""A fake Docker daemon on a unix socket: list, inspect and events, as the Engine API answers.

No registry ships a Docker daemon that runs here (it needs root-level namespaces, overlayfs
and containerd), so this is the one place a fake server is right. It speaks the real API
over a real unix socket (tests/httpservers.py), with response shapes taken from Docker 27:
``GET /containers/json?filters={"label":[...]}`` answers container summaries,
``GET /containers/{id}/json`` the inspection (404 ``{"message": "No such container: ..."}``
once removed), and ``GET /events?since=&until=&filters=`` streams one JSON event per line and
ends at ``until``, as dockerd does. ``drop()`` ends the running events stream early, as a
daemon restart would.
"""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.httpservers import Exchange, LoopbackServer, reply

_DROP: dict[str, Any] = {}


@dataclass
class FakeDocker:
    """Containers by ID and the events the running stream will send."""

    socket: str
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.http = LoopbackServer(
            {"/containers/json": self._list, "/events": self._events}, unix_socket=self.socket
        )

    def close(self) -> None:
        """Stop the daemon (a running events stream ends)."""
        self.http.close()

    def run(self, container: dict[str, Any], *, announce: bool = True) -> None:
        """A container starts: inspectable from now on, and a ``start`` event (``announce``)."""
        with self.lock:
            self.containers[container["Id"]] = copy.deepcopy(container)
        self.http.routes[f"/containers/{container['Id']}/json"] = self._inspect(container["Id"])
        if announce:
            self.events.put(container_event("start", container))

    def destroy(self, container_id: str) -> None:
        """``docker rm -f``: ``die`` then ``destroy``, and gone from list and inspect."""
        with self.lock:
            container = self.containers.pop(container_id)
        self.http.routes.pop(f"/containers/{container_id}/json", None)
        self.events.put(container_event("die", container))
        self.events.put(container_event("destroy", container))

    def drop(self) -> None:
        """End the running events stream now (a daemon restart, a proxy timing out)."""
        self.events.put(_DROP)

    def paths(self) -> list[str]:
        """Each request's path without its query, in order."""
        return [urlsplit(r.path).path for r in self.http.requests]

    def _list(self, ex: Exchange) -> None:
        query = parse_qs(urlsplit(ex.path).query)
        wanted = json.loads(query.get("filters", ["{}"])[0]).get("label", [])
        with self.lock:
            summaries = [
                {
                    "Id": c["Id"],
                    "Names": ["/" + c["Name"].lstrip("/")],
                    "Image": c["Config"]["Image"],
                    "Labels": c["Config"]["Labels"],
                    "State": c["State"]["Status"],
                    "Status": "Up 3 minutes",
                }
                for c in self.containers.values()
                if all(key in c["Config"]["Labels"] for key in wanted)
            ]
        reply(200, summaries)(ex)

    def _inspect(self, container_id: str) -> Any:
        def route(ex: Exchange) -> None:
            with self.lock:
                container = self.containers.get(container_id)
            if container is None:
                reply(404, {"message": f"No such container: {container_id}"})(ex)
            else:
                reply(200, container)(ex)

        return route

    def _events(self, ex: Exchange) -> None:
        query = {k: v[0] for k, v in parse_qs(urlsplit(ex.path).query).items()}
        until = float(query.get("until", "inf"))
        ex.send_head(200, {"Content-Type": "application/json", "Api-Version": "1.47"})
        ex.write(b"")
        while time.time() < until and not ex.stopping.is_set():
            try:
                event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if event is _DROP or not ex.write(json.dumps(event).encode() + b"\n"):
                return


def container_event(action: str, container: dict[str, Any]) -> dict[str, Any]:
    """A container event as dockerd sends it: the labels and name ride in ``Attributes``."""
    now = time.time()
    attributes = {
        **container["Config"]["Labels"],
        "image": container["Config"]["Image"],
        "name": container["Name"].lstrip("/"),
    }
    if action == "die":
        attributes["exitCode"] = "137"
    return {
        "status": action,
        "id": container["Id"],
        "from": container["Config"]["Image"],
        "Type": "container",
        "Action": action,
        "Actor": {"ID": container["Id"], "Attributes": attributes},
        "scope": "local",
        "time": int(now),
        "timeNano": int(now * 1e9),
    }
