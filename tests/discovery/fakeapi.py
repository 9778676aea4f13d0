"""A fake Kubernetes API server on loopback: pod list and watch, as kube-apiserver speaks them.

No registry ships a kube-apiserver that runs here (it needs etcd, certificates and a cluster),
so this is the one place a fake server is right. It speaks the real protocol over a real
socket (tests/httpservers.py): ``GET /api/v1/pods`` answers a ``PodList`` filtered by
``fieldSelector=spec.nodeName=...``; with ``watch=1`` it streams one JSON event per line in a
chunked HTTP/1.1 body, as the API server does (``ADDED``, ``MODIFIED``, ``DELETED``,
``BOOKMARK``, ``ERROR`` with a ``Status`` object). Each watch request takes the next step
the test scripted; with none left the watch stays open, silent, until the server closes.
"""

from __future__ import annotations

import copy
import json
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.httpservers import Exchange, LoopbackServer, TlsFiles

Step = Callable[[Exchange], None]


@dataclass
class FakeApiServer:
    """Pods by UID, a resourceVersion counter, and the scripted watch steps."""

    token: Callable[[], str] = lambda: "t0ken"
    tls: TlsFiles | None = None
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 1000
    watches: list[Step] = field(default_factory=list)
    list_failures: list[int] = field(default_factory=list)
    #: Set: every list from now on hangs after its headers (an API server that hangs).
    lists_hang: threading.Event = field(default_factory=threading.Event)
    #: Events for ``follow`` watches, as ``(type, object)``.
    live: queue.Queue[tuple[str, dict[str, Any]]] = field(default_factory=queue.Queue)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.http = LoopbackServer({"/api/v1/pods": self._route}, tls=self.tls)
        self.url = self.http.url

    def close(self) -> None:
        """Stop the server (a silent watch returns)."""
        self.http.close()

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Store a pod (as etcd would) with the next resourceVersion; returns the stored copy."""
        with self.lock:
            self.version += 1
            stored = copy.deepcopy(pod)
            stored["metadata"]["resourceVersion"] = str(self.version)
            self.pods[stored["metadata"]["uid"]] = stored
            return stored

    def delete(self, uid: str) -> None:
        """Delete a pod: gone from lists, and a DELETED event to the live watch."""
        with self.lock:
            pod = self.pods.pop(uid)
            self.version += 1
            pod["metadata"]["resourceVersion"] = str(self.version)
        self.live.put(("DELETED", pod))

    def queries(self) -> list[dict[str, str]]:
        """Each request's query parameters, in order."""
        return [
            {k: v[0] for k, v in parse_qs(urlsplit(r.path).query).items()}
            for r in self.http.requests
        ]

    def _route(self, ex: Exchange) -> None:
        if ex.headers.get("Authorization") != f"Bearer {self.token()}":
            _status(ex, 401, "Unauthorized")
            return
        query = {k: v[0] for k, v in parse_qs(urlsplit(ex.path).query).items()}
        node = query.get("fieldSelector", "").removeprefix("spec.nodeName=")
        if query.get("watch") == "1":
            step = self.watches.pop(0) if self.watches else silent
            step(ex)
            return
        if self.lists_hang.is_set():
            ex.send_head(200, {"Content-Type": "application/json"})
            ex.stopping.wait()
            return
        if self.list_failures:
            code = self.list_failures.pop(0)
            _status(ex, code, "InternalError")
            return
        with self.lock:
            items = [p for p in self.pods.values() if p["spec"].get("nodeName") == node]
            body = {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        payload = json.dumps(body).encode()
        ex.send_head(200, {"Content-Type": "application/json", "Content-Length": str(len(payload))})
        ex.write(payload)


def events(*items: tuple[str, dict[str, Any]], end: bool = True) -> Step:
    """A watch that streams ``(type, object)`` events, then ends (or, without ``end``, stays)."""

    def step(ex: Exchange) -> None:
        _chunked_head(ex)
        for kind, obj in items:
            if not send_event(ex, kind, obj):
                return
        if end:
            ex.write(b"0\r\n\r\n")
        else:
            ex.stopping.wait()

    return step


def follow(api: FakeApiServer) -> Step:
    """A watch that streams what the test puts in ``api.live``, until the server closes."""

    def step(ex: Exchange) -> None:
        _chunked_head(ex)
        while not ex.stopping.is_set():
            try:
                kind, obj = api.live.get(timeout=0.05)
            except queue.Empty:
                continue
            if not send_event(ex, kind, obj):
                return

    return step


def bookmark(version: str) -> tuple[str, dict[str, Any]]:
    """A BOOKMARK event: only the resourceVersion is meaningful."""
    return (
        "BOOKMARK",
        {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": version}},
    )


def expired() -> tuple[str, dict[str, Any]]:
    """The ERROR event the API server sends when the watched resourceVersion is compacted."""
    return (
        "ERROR",
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version: 1001 (48213)",
            "reason": "Expired",
            "code": 410,
        },
    )


def http_status(code: int) -> Step:
    """A watch refused with a ``Status`` body (410 Gone, 500, ...)."""
    return lambda ex: _status(ex, code, "Gone" if code == 410 else "InternalError")


def silent(ex: Exchange) -> None:
    """A watch that sends its headers, then nothing: a hung API server or a dead proxy."""
    _chunked_head(ex)
    ex.stopping.wait()


def send_event(ex: Exchange, kind: str, obj: dict[str, Any]) -> bool:
    """One watch event as one chunk holding one JSON line; False once the client is gone."""
    line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
    return ex.write(b"%x\r\n%s\r\n" % (len(line), line))


def _chunked_head(ex: Exchange) -> None:
    ex.protocol_version = "HTTP/1.1"
    ex.close_connection = True
    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    ex.send_head(200, {**headers, "Connection": "close"})  # the next watch: a new connection


def _status(ex: Exchange, code: int, reason: str) -> None:
    body = json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    ).encode()
    ex.send_head(code, {"Content-Type": "application/json", "Content-Length": str(len(body))})
    ex.write(body)


def bookmarks_forever(every: float) -> Step:
    """A watch that never ends by itself: a bookmark every ``every`` seconds (a proxy that
    ignores ``timeoutSeconds``, or a server that lost count)."""

    def step(ex: Exchange) -> None:
        _chunked_head(ex)
        n = 0
        while not ex.stopping.wait(every):
            n += 1
            if not send_event(ex, *bookmark(str(5000 + n))):
                return

    return step
