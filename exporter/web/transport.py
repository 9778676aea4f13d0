"""The HTTP(S) transport: uvicorn in a thread, the listening socket, caps and deadlines.

Owns the socket (backlog, connection cap at accept, TCP_NODELAY), the TLS handshake deadline,
the per-request deadline and head cap (``exporter.web.protocol``), keep-alive and shutdown.
Serves ``exporter.web.app.WebApp``; builds no metrics and no status itself.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import os
import resource
import socket
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import uvicorn

from exporter.base.errors import ExporterError
from exporter.web.app import WebApp, WebRoutes
from exporter.web.config import ReloadingSSLContext, WebConfig, WebConfigWatch, load_web_config
from exporter.web.protocol import Guard, IdleConnections, guarded_protocol

log = logging.getLogger(__name__)

# The stdlib default of 5 drops SYNs under concurrent scrapes (RELIABILITY.md finding 1).
BACKLOG: Final = 1024
# asyncio's TLS read buffer is 256 KiB per connection, allocated at accept: 1000 silent
# connections cost 250 MiB that glibc then keeps. One TLS record (16 KiB) is enough here.
TLS_READ_BUFFER: Final = 16 * 1024
_WANTED_OPEN_FILES: Final = 65536
#: Descriptors kept for the sources (/proc files, logs, NVML's pipes, sqlite, probes).
_RESERVED_FILES: Final = 256
_MIN_CONNECTIONS: Final = 16
_REPORT_EVERY_SECONDS: Final = 10.0


@dataclass(frozen=True, slots=True)
class WebLimits:
    """Deadlines and caps that keep idle, slow or numerous clients from holding the server.

    Attributes:
        max_connections: open connections (TLS handshakes included) beyond which new ones
            are closed at accept; bounds memory under a connection flood.
        tls_handshake_seconds: a TLS client must finish its handshake within this.
        request_seconds: a request (headers and body) must arrive within this of the
            connection being opened or becoming idle.
        keep_alive_seconds: an idle keep-alive connection is closed after this.
        handler_seconds: a route that takes longer answers 503.
    """

    max_connections: int = 1024
    tls_handshake_seconds: float = 5.0
    request_seconds: float = 10.0
    keep_alive_seconds: int = 5
    handler_seconds: float = 10.0


class WebServer:
    """The exporter's HTTP(S) server, run in a background thread.

    The web config file is validated here and re-read whenever it changes; certificates
    rotated on disk are presented on the next connection.

    Raises:
        ConfigError: from the constructor, when the web config file is invalid.
    """

    def __init__(
        self,
        routes: WebRoutes,
        *,
        listen_address: str = ":10049",
        web_config_file: str | None = None,
        limits: WebLimits | None = None,
    ) -> None:
        config = load_web_config(web_config_file) if web_config_file else WebConfig()
        self._routes = routes
        self._address = listen_address
        self._limits = limits or WebLimits()
        self._watch = WebConfigWatch(web_config_file, config)
        self._ssl = ReloadingSSLContext(self._watch) if config.tls else None
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._app: WebApp | None = None

    @property
    def port(self) -> int:
        """The bound TCP port (useful with ``:0``)."""
        if self._sock is None:
            raise RuntimeError("WebServer.port read before start()")
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        """Bind the listening socket and start serving in a thread.

        Raises:
            ExporterError: the address cannot be bound; the message names the flag.
        """
        if self._thread is not None:
            raise RuntimeError("WebServer already started")
        _raise_open_files_limit()
        if self._ssl is not None:
            # A class attribute read per connection; nothing else in the daemon speaks TLS
            # through asyncio, so shrinking it process-wide costs no one anything.
            asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
        self._guard = Guard(self._limits.request_seconds, self._watch)
        cap = _connection_cap(self._limits.max_connections)
        self._sock = _CappedListener.adopt(_listen(self._address), cap, self._guard.idle)
        self._app = WebApp(self._routes, self._watch, self._limits.handler_seconds)
        self._server = _Server(self._uvicorn_config(self._app), self._watch.refresh)
        self._thread = threading.Thread(target=self._serve, name="web-server", daemon=True)
        self._thread.start()
        self._wait_started()
        config = self._watch.last_good
        log.info(
            "web server listening address=%s port=%d tls=%s basic_auth=%s",
            self._address,
            self.port,
            config.tls is not None,
            bool(config.basic_auth_users),
        )

    def stop(self) -> None:
        """Stop serving, close connections and the socket; safe to call twice."""
        if self._server is None or self._thread is None:
            return
        self._server.exit_now()
        self._thread.join(timeout=10)
        if self._app is not None:
            self._app.close()
        if self._sock is not None:
            self._sock.close()
        self._server, self._thread = None, None

    def _uvicorn_config(self, app: WebApp) -> uvicorn.Config:
        ssl_context = self._ssl
        config = uvicorn.Config(
            app,
            http=guarded_protocol(self._guard),
            ws="none",
            lifespan="off",
            interface="asgi3",
            # Never let uvicorn configure logging; access logs would carry URLs and client IPs.
            log_config=None,
            log_level=logging.ERROR,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            backlog=BACKLOG,
            limit_concurrency=self._limits.max_connections + 1,
            timeout_keep_alive=self._limits.keep_alive_seconds,
            timeout_graceful_shutdown=2,
            ssl_context_factory=(lambda _c, _d: ssl_context) if ssl_context else None,
        )
        config.load()
        return config

    def _serve(self) -> None:
        assert self._server is not None and self._sock is not None
        loop = _EventLoop(self._limits.tls_handshake_seconds)
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._sock]))
        except Exception:  # the thread's last line of defence: make a dead server visible
            log.exception("web server stopped unexpectedly")
        finally:
            _close_loop(loop)

    def _wait_started(self) -> None:
        assert self._server is not None and self._thread is not None
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ExporterError(f"cannot serve on {self._address} (--web.listen-address)")
            time.sleep(0.005)


class _Server(uvicorn.Server):
    """uvicorn's server, minus its 10 Hz housekeeping.

    uvicorn wakes every 100 ms to refresh its Date header and look at ``should_exit``: 2.7 ms
    of CPU a second on an idle exporter, a quarter of the sampling budget (docs/benchmark.md).
    This loop wakes once a second for the Date header and to have the web config files
    looked at in a worker thread (a stat that hangs on a stuck mount then holds that thread,
    never the loop; the next look waits for it), and ``exit_now()`` wakes it at once.
    """

    _loop: asyncio.AbstractEventLoop | None = None
    _wake: asyncio.Event | None = None

    def __init__(self, config: uvicorn.Config, refresh_files: Callable[[], None]) -> None:
        super().__init__(config)
        self._refresh_files = refresh_files
        self._refreshing: asyncio.Future[None] | None = None
        #: Its own thread, not the loop's default executor: closing the loop waits for that
        #: one, and a look stuck on a dead mount must not hold up a stop.
        self._files_pool = ThreadPoolExecutor(1, thread_name_prefix="web-files")

    async def main_loop(self) -> None:
        """Refresh the Date header and the web config every second until told to exit."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            self._look_at_files(self._loop)
            counter = (counter + 10) % 864000  # on_tick does its per-second work on multiples of 10
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()

    def _look_at_files(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            return
        try:
            self._refreshing = loop.run_in_executor(self._files_pool, self._refresh_files)
        except RuntimeError:  # exit_now() shut the pool down meanwhile
            return
        self._refreshing.add_done_callback(_log_refresh_failure)

    def exit_now(self) -> None:
        """Ask the server to exit, from any thread."""
        self._files_pool.shutdown(wait=False, cancel_futures=True)
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)


def _log_refresh_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.error("web config files could not be looked at error=%r", str(exc))


class _EventLoop(asyncio.SelectorEventLoop):
    """An event loop whose servers get our TLS handshake deadline.

    uvicorn does not pass ``ssl_handshake_timeout`` (asyncio's default is 60 s), and a client
    that connects and never sends a ClientHello must not hold a socket that long.
    """

    def __init__(self, handshake_seconds: float) -> None:
        super().__init__()
        self._handshake_seconds = handshake_seconds
        self.set_exception_handler(_RateLimitedReports().report)

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        """Create a server as usual, with the handshake deadline when TLS is on."""
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self._handshake_seconds)
        return await super().create_server(*args, **kwargs)


class _RateLimitedReports:
    """asyncio's error reports, at most one line per kind every ``_REPORT_EVERY_SECONDS``.

    Out of descriptors, asyncio reports a failed accept on every loop turn: tens of
    thousands of tracebacks a second that would fill the journal and starve the loop.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def report(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's exception handler: count every report, log the first of each window."""
        kind = str(context.get("message", "asyncio error"))
        now = time.monotonic()
        at, missed = self._last.get(kind, (-_REPORT_EVERY_SECONDS, 0))
        if now - at < _REPORT_EVERY_SECONDS:
            self._last[kind] = (at, missed + 1)
            return
        self._last[kind] = (now, 0)
        exc = context.get("exception")
        log.error(
            "event loop error message=%r error=%s suppressed_since_last=%d",
            kind,
            type(exc).__name__ if exc is not None else "-",
            missed,
        )


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    # uvicorn closes the connections it knows; a TLS handshake still in progress is an
    # asyncio accept task it never saw. Cancelling it closes its transport.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    for _ in range(3):  # transports finish closing on the next iterations
        loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(loop.shutdown_default_executor())
    asyncio.set_event_loop(None)
    loop.close()


def _listen(address: str) -> socket.socket:
    where = f"cannot listen on {address} (--web.listen-address)"
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ExporterError(f"{where}: expected [host]:port, such as :10049 or 127.0.0.1:10049")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        if not host and socket.has_dualstack_ipv6():
            return socket.create_server(
                ("::", int(port)), family=socket.AF_INET6, dualstack_ipv6=True, backlog=BACKLOG
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host or "0.0.0.0", int(port)), family=family, backlog=BACKLOG)
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno and exc.errno > 0 else str(exc)
        raise ExporterError(f"{where}: {reason}") from exc


class _CappedListener(socket.socket):
    """A listening socket that closes new connections beyond a cap, at accept.

    asyncio accepts without limit, and a TLS connection costs its buffers before the
    handshake, where no protocol callback can refuse it. Counting the accepted sockets that
    are still open bounds memory and file descriptors under a flood; deadlines then reclaim
    the flood's sockets and the cap frees up.
    """

    _limit: int
    _open: list[weakref.ref[socket.socket]]
    _shedding: bool
    _idle: IdleConnections

    @classmethod
    def adopt(cls, sock: socket.socket, limit: int, idle: IdleConnections) -> _CappedListener:
        """Take over a bound, listening socket."""
        capped = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        capped._limit, capped._open, capped._shedding = limit, [], False
        capped._idle = idle
        return capped

    def accept(self) -> tuple[socket.socket, object]:
        """Accept one connection; at the cap, close the longest-idle one for it, or this one."""
        conn, address = super().accept()
        if len(self._open) >= self._limit:
            self._open = [r for r in self._open if (s := r()) is not None and s.fileno() != -1]
        if len(self._open) >= self._limit and not self._idle.close_oldest():
            if not self._shedding:  # logged before the close a client could observe
                log.warning(
                    "connection limit reached, closing new connections limit=%d", self._limit
                )
            conn.close()
            self._shedding = True
            # asyncio ends this accept round quietly on ConnectionAbortedError.
            raise ConnectionAbortedError("connection limit reached")
        if self._shedding:
            log.info("connection limit no longer reached limit=%d", self._limit)
        self._shedding = False
        self._open.append(weakref.ref(conn))
        # asyncio sets TCP_NODELAY only when proto is IPPROTO_TCP, and create_server() leaves
        # it 0; without it the body waits for the header's delayed ACK (40 ms per response).
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address


def _connection_cap(wanted: int) -> int:
    """The connection cap, kept under the open files limit with a reserve for the sources.

    Past the limit accept() fails with EMFILE (asyncio logs it on every loop turn) and the
    sources fail for want of descriptors: the cap must bite first.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    cap = max(_MIN_CONNECTIONS, min(wanted, soft - _RESERVED_FILES))
    if cap < wanted:
        log.warning(
            "connection cap lowered to fit the open files limit cap=%d open_files_limit=%d",
            cap,
            soft,
        )
    return cap


def _raise_open_files_limit() -> None:
    # As Go's runtime does since 1.19: a 1024 soft limit would let a connection flood make
    # accept() fail with EMFILE before the deadlines reclaim sockets.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        log.debug("raised open files limit from=%d to=%d", soft, wanted)
