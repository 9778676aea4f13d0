"""The probes' HTTP/1.1 client: bounded requests, one kept-alive connection, TLS, no proxy.

A leaf: it knows URLs, sockets and deadlines, not engines. Every request has one total
deadline (a ``Watchdog`` shuts the socket down at it, so no read outlives it), a body cap
after decompression, no redirects followed and no proxy (nothing reads the environment).
Failures come back as ``Failed`` with the bounded ``ProbeOutcome`` that says why.

The client speaks HTTP/1.1 over a plain socket, replies parsed by httptools (``wire``):
httpx's layers cost about 1 ms of CPU a request, most of a target's tick, and h11's
pure-Python parsing about 0.07 ms, a third of a kept-alive probe (issue 18). httpx still
parses the target's URL, so a URL means here what ``check-config`` (which asks httpx) judged
it to mean.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Final

import httpx

from exporter.base.errors import ConfigError
from exporter.base.model import ProbeOutcome
from exporter.base.watchdog import Watchdog
from exporter.sources.probe.wire import (
    BodyDecoder,
    BodyTooLarge,
    Connection,
    Expired,
    content_encoding,
    is_stale,
)

log = logging.getLogger(__name__)


class Failed(Exception):
    """An exchange that gave no complete response, with the outcome that says why."""

    def __init__(self, outcome: ProbeOutcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


@dataclass(slots=True)
class Reply:
    """What arrived of a response so far (mutable while the probe runs)."""

    status: int | None = None
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request path of a target goes, worked out once from its URL."""

    host: str
    port: int
    tls: bool
    target: bytes  # the request line's target: the base URL's path joined with the probe's
    host_header: bytes

    @property
    def origin(self) -> tuple[str, int, bool]:
        """Where a connection for this route goes: host, port and TLS or not."""
        return (self.host, self.port, self.tls)


def route_for(base_url: str, path: str) -> Route:
    """The route httpx's ``Client(base_url=...)`` would take for ``path``.

    httpx (as ``check-config`` does) parses the URL: IDNA host names, IPv6 literals and
    percent-encoding mean the same as before; a base path prefixes the probe's path.
    """
    base = httpx.URL(base_url)
    if not base.raw_path.endswith(b"/"):
        base = base.copy_with(raw_path=base.raw_path + b"/")
    url = base.copy_with(raw_path=base.raw_path + httpx.URL(path).raw_path.lstrip(b"/"))
    tls = url.scheme == "https"
    return Route(
        host=url.raw_host.decode("ascii"),
        port=url.port or (443 if tls else 80),
        tls=tls,
        target=url.raw_path,
        host_header=url.netloc,
    )


class _Stale(Exception):
    """A reused connection that the server had closed: one fresh connection is tried."""


@dataclass(frozen=True, slots=True)
class _Request:
    """One request as the exchange sends it, the same on a retry."""

    method: str
    route: Route
    content: bytes | None
    cap: int  # the body cap, after decompression
    keep: bool  # over the kept connection, and kept after when it ended cleanly


def body_ignored(status: int) -> bool:
    """Redirect and auth replies are judged by status alone; their bodies are not read."""
    return 300 <= status < 400 or status in (401, 403)


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def classify(exc: Exception, expired: bool) -> ProbeOutcome:
    """Bounded outcome of a probe that ended in an exception."""
    if expired or isinstance(exc, TimeoutError | Expired):
        return ProbeOutcome.TIMEOUT
    if isinstance(exc, BodyTooLarge):
        return ProbeOutcome.BODY_TOO_LARGE
    if isinstance(exc, zlib.error):
        return ProbeOutcome.BAD_BODY
    chain = _causes(exc)
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return ProbeOutcome.TLS
    if any(isinstance(e, OSError) and e.errno == errno.ECONNREFUSED for e in chain):
        return ProbeOutcome.REFUSED
    return ProbeOutcome.ERROR


#: Verifying contexts by CA file and that file's identity: loading the system store costs
#: about 0.9 MiB of native memory a context, which was most of the RSS added per target.
_CONTEXTS: dict[tuple[str | None, tuple[int, int, int] | None], ssl.SSLContext] = {}
_CONTEXTS_LOCK: Final = threading.Lock()


def _ca_identity(ca_file: str | None) -> tuple[int, int, int] | None:
    """Inode, size and mtime of the CA file (the system bundle for None): a new one reloads."""
    path = ca_file or ssl.get_default_verify_paths().cafile
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)


def _ssl_context(ca_file: str | None) -> ssl.SSLContext:
    key = (ca_file, _ca_identity(ca_file))
    with _CONTEXTS_LOCK:
        if (cached := _CONTEXTS.get(key)) is not None:
            return cached
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise ConfigError(ca_file or "", "ca_file", f"cannot load: {reason}") from None
    context.set_alpn_protocols(["http/1.1"])  # as httpcore offered: the probes speak only that
    with _CONTEXTS_LOCK:
        stale = [k for k in _CONTEXTS if k[0] == ca_file]  # an older identity of the same file
        for k in stale:
            del _CONTEXTS[k]
        return _CONTEXTS.setdefault(key, context)


class HttpClient:
    """Bounded HTTP/1.1 requests to one base URL, over at most one kept-alive connection.

    A request with ``keep`` goes over the kept connection, reused while every exchange on it
    ends cleanly and it stays quiet while idle; anything else closes it and the next request
    connects afresh. Without ``keep`` it opens a connection of its own, closed after (the
    completion probe, in another thread). One retry in one case only: a reused kept
    connection that fails before any byte of the response (the server closed it as it was
    reused) is tried once more over a fresh one, within the same total deadline.
    """

    def __init__(
        self,
        base_url: str,
        first_path: str,
        headers: tuple[tuple[bytes, bytes], ...],
        *,
        cap: int,
        ca_file: str | None = None,
        name: str = "",
    ) -> None:
        """Work out ``first_path``'s route now (a bad URL fails here) and the TLS context.

        Raises:
            ConfigError: the CA file cannot be loaded.
        """
        self._base_url = base_url
        self._headers: Final = headers
        self._cap = cap
        self._name = name
        first = route_for(base_url, first_path)
        # Every path shares the base URL's scheme; loading the system CA store costs about
        # 1 MiB of native memory, which a plain-HTTP fleet never needs.
        self._tls: Final = _ssl_context(ca_file) if first.tls or ca_file else None
        # By path, a handful per target.
        self._routes = {first_path: first}
        # The kept connection. Taken out while a request uses it, so close() (another
        # thread's, at shutdown, even while a stuck request runs) never closes a socket in use.
        self._kept: Connection | None = None
        self._kept_lock: Final = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Close the kept connection; a request still running then keeps nothing after it."""
        with self._kept_lock:
            self._closed = True
            kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()  # idle: no watchdog watches it
        self._routes.clear()

    def request(
        self,
        method: str,
        path: str,
        content: bytes | None,
        reply: Reply,
        timeout: float,
        cap: int | None = None,
        *,
        keep: bool,
    ) -> None:
        """One bounded exchange into ``reply``; any failure as ``Failed`` with its outcome.

        With ``keep`` it goes over the kept connection (and keeps it for the next when it
        ended cleanly); otherwise over a fresh connection, closed after.
        """
        dog = Watchdog(timeout)
        try:
            deadline = time.monotonic() + timeout
            self._exchange(method, path, content, reply, deadline, dog, cap or self._cap, keep)
        except Exception as exc:
            outcome = classify(exc, dog.fired)
            if outcome is ProbeOutcome.ERROR:
                log.debug(
                    "probe error target=%s path=%s error=%s",
                    self._name,
                    path,
                    type(exc).__name__,
                )
            raise Failed(outcome) from exc
        finally:
            dog.disarm()

    def _exchange(
        self,
        method: str,
        path: str,
        content: bytes | None,
        reply: Reply,
        deadline: float,
        dog: Watchdog,
        cap: int,
        keep: bool,
    ) -> None:
        route = self._routes.get(path)
        if route is None:
            route = self._routes[path] = route_for(self._base_url, path)
        request = _Request(method, route, content, cap, keep)
        kept = self._take_kept(route) if keep else None
        if kept is not None:
            try:
                self._over(kept, request, reply, deadline, dog, reused=True)
                return
            except _Stale:
                if time.monotonic() >= deadline:  # the one fresh try stays inside the deadline
                    raise Expired from None
        sock = self._connect(route, deadline, dog)
        self._over(Connection(sock, route.origin), request, reply, deadline, dog, reused=False)

    def _over(
        self,
        conn: Connection,
        request: _Request,
        reply: Reply,
        deadline: float,
        dog: Watchdog,
        *,
        reused: bool,
    ) -> None:
        """One exchange over ``conn``, then kept for the next (``request.keep``) or closed.

        Raises:
            _Stale: ``conn`` was reused and failed before any byte of the response (closed
                now; the watchdog stays armed for the one fresh try).
        """
        dog.watch(conn.sock)
        conn.begin()
        try:
            self._send_and_read(conn, request, reply, deadline)
        except BaseException as exc:  # closed on anything, as a finally would
            stale = reused and is_stale(conn, exc)
            if stale:
                dog.watch(None)  # lets go of this socket; the fresh try watches its own
                fired = dog.fired
            else:
                fired = dog.disarm()
            conn.close()  # after watch(None) or disarm(): no watchdog touches a released socket
            if stale and not fired:
                raise _Stale from exc
            raise
        fired = dog.disarm()  # before close(), as above; a kept socket is watched by no one
        if fired or not (request.keep and conn.reusable()):
            conn.close()
            if fired:  # a close-delimited body cut by the watchdog looks complete; it is not
                raise Expired
            return
        self._keep(conn)

    def _send_and_read(
        self, conn: Connection, request: _Request, reply: Reply, deadline: float
    ) -> None:
        route, content = request.route, request.content
        headers = [(b"Host", route.host_header), *self._headers]
        if content is not None:
            headers += [
                (b"Content-Type", b"application/json"),
                (b"Content-Length", b"%d" % len(content)),
            ]
        lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), route.target)]
        lines += [b"%s: %s" % header for header in headers]
        data = b"\r\n".join(lines) + b"\r\n\r\n" + (content or b"")
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        conn.sock.sendall(data)
        reply.status = conn.read_head(deadline)
        if not body_ignored(reply.status):  # an unread body: the connection is closed
            decoder = BodyDecoder(content_encoding(conn.response.headers), request.cap)
            conn.read_body(deadline, decoder)
            reply.body = bytes(decoder.body)

    def _take_kept(self, route: Route) -> Connection | None:
        """The kept connection when it goes to ``route``'s origin and stayed quiet; else None."""
        with self._kept_lock:
            kept, self._kept = self._kept, None
        if kept is None:
            return None
        if kept.origin == route.origin and kept.idle():
            return kept
        kept.close()  # idle: no watchdog watches it
        return None

    def _keep(self, conn: Connection) -> None:
        """Keep ``conn`` for the next request, unless the prober was closed meanwhile."""
        with self._kept_lock:
            if self._closed or self._kept is not None:
                spare: Connection | None = conn
            else:
                self._kept, spare = conn, None
        if spare is not None:
            spare.close()

    def _connect(self, route: Route, deadline: float, dog: Watchdog) -> socket.socket:
        """A connected (and for https, handshaken) socket, watched by ``dog``; no proxy."""
        sock = socket.create_connection(
            (route.host, route.port), timeout=max(deadline - time.monotonic(), 0.001)
        )
        try:
            dog.watch(sock)
            if route.tls:
                assert self._tls is not None  # made whenever the base URL is https
                # The handshake after watch(): wrapping takes the descriptor from ``sock``.
                sock = self._tls.wrap_socket(
                    sock, server_hostname=route.host, do_handshake_on_connect=False
                )
                dog.watch(sock)
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.do_handshake()
        except BaseException:
            dog.watch(None)  # before close(): the watchdog must not touch a released socket
            sock.close()
            raise
        return sock
