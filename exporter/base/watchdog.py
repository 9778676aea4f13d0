"""A deadline that holds for a whole request: a watchdog that shuts the socket down.

Used by the probes' client and by the discovery watches. Threads and sockets from the
standard library only, so every layer can stand on it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from typing import Any, Final

# Events of httpcore's ``trace`` extension that hand over the connection's network stream.
# connect_unix_socket: the Docker Engine API's socket (exporter/discovery/docker.py).
_STREAM_EVENTS: Final = frozenset(
    {
        "connection.connect_tcp.complete",
        "connection.connect_unix_socket.complete",
        "connection.start_tls.complete",
    }
)


class _Deadlines:
    """One daemon thread that fires every armed watchdog at its deadline.

    A ``threading.Timer`` per request cost a thread start (and the wait for it to run) on
    every probe, the larger part of a health probe's CPU; one thread and a heap of deadlines
    keep the same hard bound. Started on first use, so importing this module starts nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watchdog]] = []
        self._order = itertools.count()  # ties broken by arming order, never by Watchdog
        self._thread: threading.Thread | None = None

    def arm(self, dog: Watchdog, at: float) -> None:
        """Fire ``dog`` at monotonic time ``at`` unless it is disarmed first."""
        with self._cond:
            earliest = not self._heap or at < self._heap[0][0]
            heapq.heappush(self._heap, (at, next(self._order), dog))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="probe-watchdog", daemon=True
                )
                self._thread.start()
            elif earliest:  # wake the thread only when it sleeps past the new deadline
                self._cond.notify()

    def _run(self) -> None:
        while True:
            due: list[Watchdog] = []
            with self._cond:
                # Done watchdogs at the head are dropped without waiting for their deadline.
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
                if not due:
                    self._cond.wait(self._heap[0][0] - now)
                    continue
            for dog in due:  # outside the heap's lock: fire takes the watchdog's own lock
                dog.fire()


_DEADLINES: Final = _Deadlines()


class Watchdog:
    """Shuts a request's socket down at the deadline, so no single read can outlive it.

    Used by the probes and by the Kubernetes watch (which also fires it to stop at once).

    httpx timeouts apply per read (encode/httpx#1450): a server trickling its headers or body
    would otherwise hold the probe far past its deadline. The socket comes from httpcore's
    ``trace`` extension (the watch) or from ``watch`` (the probes' own client); shutting it
    down wakes the blocked read with an end of file. The deadline is kept by one shared
    thread (``_Deadlines``), not a timer thread per request.
    """

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._done = False
        self.fired = False
        _DEADLINES.arm(self, time.monotonic() + seconds)

    @property
    def done(self) -> bool:
        """True once disarmed: the deadline thread may forget it."""
        return self._done

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """Trace callback for httpcore: remember the newest socket of this request."""
        if event not in _STREAM_EVENTS or info.get("return_value") is None:
            return
        sock = info["return_value"].get_extra_info("socket")
        self.watch(sock if isinstance(sock, socket.socket) else None)

    def watch(self, sock: socket.socket | None) -> None:
        """Shut ``sock`` down at the deadline (at once if it passed); replaces the last one."""
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shutdown()

    def disarm(self) -> bool:
        """Leave the socket alone from now on; True if it had fired."""
        with self._lock:
            self._done = True
            return self.fired

    def fire(self) -> None:
        """Shut the socket down now (as the deadline would), unless the request is done."""
        with self._lock:
            if self._done:
                return
            self.fired = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is None:
            return
        # OSError: already closed, the request ended on its own. The base method on purpose:
        # SSLSocket.shutdown also drops its SSL object, which the reading thread may be using.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
