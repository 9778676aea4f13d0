"""uvicorn's httptools protocol, guarded for an exposed exporter: the one use of private API.

Why a subclass: the request-head deadline, the 16 KiB head cap and the SAN check must see
every byte and parser event of a connection, pipelined requests included. uvicorn's public
surface has nothing for them: ``h11_max_incomplete_event_size`` only applies to the h11
protocol (about twice the CPU per scrape, docs/benchmark.md), ``timeout_keep_alive`` only
covers idle connections, and an ASGI middleware runs after the head was parsed. So
``HttpToolsProtocol`` (``uvicorn.protocols.http.httptools_impl``, private) is subclassed
here and nowhere else; ``exporter.web.transport`` hands the class to ``uvicorn.Config(http=)``,
which is public. Tested against uvicorn 0.54.0 (tests/web/test_server.py pins the behaviour:
slowloris deadline, head cap, pipelining, one send per response); re-check on an upgrade.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Final, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from exporter.web.config import WebConfigWatch, peer_allowed

log = logging.getLogger(__name__)

# What h11 allows a request line and headers; llhttp would buffer any size.
MAX_REQUEST_HEAD: Final = 16 * 1024


class IdleConnections:
    """HTTP connections with no request under way, oldest first (loop thread only).

    When the server is full, the oldest of them is closed to let a new connection in: a
    thousand sockets that send nothing cannot crowd out the scraper.
    """

    def __init__(self) -> None:
        self._idle: dict[GuardedProtocol, None] = {}

    def mark(self, connection: GuardedProtocol, *, idle: bool) -> None:
        """Record whether a connection waits for a request's first byte (newest last)."""
        self._idle.pop(connection, None)
        if idle:
            self._idle[connection] = None

    def close_oldest(self) -> bool:
        """Close the connection idle the longest; False when none is idle."""
        while self._idle:
            oldest = next(iter(self._idle))
            del self._idle[oldest]
            if not oldest.transport.is_closing():
                oldest.transport.close()
                return True
        return False


@dataclass(frozen=True, slots=True)
class Guard:
    """What every connection is held to: the request deadline and the client SAN check."""

    request_seconds: float
    watch: WebConfigWatch
    idle: IdleConnections = field(default_factory=IdleConnections)

    def admits(self, transport: asyncio.BaseTransport) -> bool:
        """False when TLS demands client SANs and this peer's certificate has none allowed."""
        tls = self.watch.last_good.tls
        if tls is None or not tls.client_allowed_sans:
            return True
        return peer_allowed(transport.get_extra_info("peercert"), tls.client_allowed_sans)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus what it lacks for an exposed exporter.

    httptools parses in C (llhttp): a scrape costs about half the CPU of uvicorn's h11
    protocol (docs/benchmark.md). What uvicorn leaves out is added here:

    - a deadline for receiving a request: a client that sends half a request line
      (slowloris) or a never-ending body would hold its connection forever. Each request
      must arrive completely within ``request_seconds`` of the connection opening or
      becoming idle;
    - a cap on a request's head: llhttp buffers a request line and headers of any size,
      where h11 stops at 16 KiB. A head past ``MAX_REQUEST_HEAD`` gets 400 and a close;
    - the ``client_allowed_sans`` check, which needs the TLS transport;
    - one send per response (``_CoalescingTransport``), not one per part.
    """

    guard: ClassVar[Guard]
    _deadline: asyncio.TimerHandle | None = None
    _head_bytes: int = 0
    _in_head: bool = True  # the next bytes belong to a request line or headers

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Register the connection; drop it at once when its certificate's SANs are refused."""
        super().connection_made(cast(asyncio.Transport, _CoalescingTransport(transport)))
        if not self.guard.admits(transport):
            log.debug("client certificate refused reason=client_allowed_sans")
            transport.abort()
            return
        self._watch_request()

    def data_received(self, data: bytes) -> None:
        """Count head bytes, feed the parser, then (re)consider the request deadline."""
        if self._in_head:
            # Counted before parsing: bytes of a body that share the head's read count too,
            # so the cap can only err towards refusing, never towards buffering more.
            self._head_bytes += len(data)
            if self._head_bytes > MAX_REQUEST_HEAD:
                self.send_400_response("Request head too large.")
                return
        super().data_received(data)
        self._watch_request()

    def on_headers_complete(self) -> None:
        """The head is in: what follows is a body or the next request."""
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The request is in: the next bytes start the next request's head."""
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def on_response_complete(self) -> None:
        """Finish the cycle; the next request (or an unread body) is under a deadline again."""
        super().on_response_complete()
        self._watch_request()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the deadline with the connection."""
        self._cancel_deadline()
        self.guard.idle.mark(self, idle=False)
        super().connection_lost(exc)

    def _receiving(self) -> bool:
        """Waiting on the client (for a request's head or body), not on our answer."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or cycle.more_body

    def _watch_request(self) -> None:
        idle = self._receiving() and self._in_head and not self._head_bytes
        self.guard.idle.mark(self, idle=idle and not self.transport.is_closing())
        if not self._receiving() or self.transport.is_closing():
            self._cancel_deadline()
        elif self._deadline is None:
            self._deadline = self.loop.call_later(self.guard.request_seconds, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self._receiving() and not self.transport.is_closing():
            self.transport.abort()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


class _CoalescingTransport:
    """A transport whose writes within one turn of the event loop leave as one send.

    uvicorn writes a response's head and body separately; with TCP_NODELAY each becomes its
    own send() and its own packet, and on loopback the sender pays for the receiver's wakeup
    too. Joined, a cached /metrics answer costs one syscall (docs/benchmark.md). Everything
    else is the wrapped transport's.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data``; it is sent at the end of this turn of the loop."""
        if not data:
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Iterable[bytes | bytearray | memoryview]) -> None:
        """Queue every item of ``lines``."""
        for data in lines:
            self.write(data)

    def write_eof(self) -> None:
        """Send what is queued, then half-close."""
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        """Send what is queued, then close as the transport does (after its buffer drains)."""
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        """Drop what is queued and close at once."""
        self._pending.clear()
        self._transport.abort()

    def _flush(self) -> None:
        if self._pending and not self._transport.is_closing():
            self._transport.write(b"".join(self._pending))
        self._pending.clear()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


def guarded_protocol(guard: Guard) -> type[asyncio.Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` bound to ``guard``."""
    return cast(type[asyncio.Protocol], type("_Protocol", (GuardedProtocol,), {"guard": guard}))
