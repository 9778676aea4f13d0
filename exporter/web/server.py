"""The HTTP(S) server: /metrics, /status, /, /-/healthy and /-/ready on uvicorn in a thread.

Owns the listening socket, deadlines and the web config (TLS, basic auth, headers, rate limit).
Builds no metrics and no status itself: the daemon hands in a registry and callbacks.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import functools
import gzip
import logging
import os
import resource
import socket
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Final, TypeVar, cast

import prometheus_client
import uvicorn
from prometheus_client.exposition import choose_encoder
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from exporter.errors import ConfigError, ExporterError
from exporter.web.config import (
    BasicAuthUsers,
    RateLimit,
    ReloadingSSLContext,
    WebConfig,
    WebConfigWatch,
    load_web_config,
    parse_basic_authorization,
    peer_allowed,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# The stdlib default of 5 drops SYNs under concurrent scrapes (RELIABILITY.md finding 1).
BACKLOG: Final = 1024
# asyncio's TLS read buffer is 256 KiB per connection, allocated at accept: 1000 silent
# connections cost 250 MiB that glibc then keeps. One TLS record (16 KiB) is enough here.
TLS_READ_BUFFER: Final = 16 * 1024
HANDLER_THREADS: Final = 4
# What h11 allows a request line and headers; llhttp would buffer any size.
MAX_REQUEST_HEAD: Final = 16 * 1024
GZIP_LEVEL: Final = 1
DEFAULT_PAGE_CSP: Final = "default-src 'self'"
_ALLOWED_METHODS: Final = ("GET", "HEAD")
_WANTED_OPEN_FILES: Final = 8192

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class WebRoutes:
    """What the daemon provides to the web server.

    Attributes:
        registry: rendered at /metrics; its collectors must do no I/O.
        status: the JSON body of /status.
        page: the HTML of /.
        ready: whether /-/ready answers 200.
        page_csp: the Content-Security-Policy of / (a web config header overrides it).
        metrics_key: what the registry renders from (the daemon's latest snapshot). While it
            returns the same object, /metrics is not rendered again: each format and encoding
            is rendered once and its bytes served to every scrape. None renders every scrape.
    """

    registry: prometheus_client.CollectorRegistry
    status: Callable[[], bytes]
    page: Callable[[], bytes]
    ready: Callable[[], bool]
    page_csp: str = DEFAULT_PAGE_CSP
    metrics_key: Callable[[], object] | None = None


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


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


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
        self._app: _App | None = None

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
        self._sock = _CappedListener.adopt(_listen(self._address), self._limits.max_connections)
        self._app = _App(self._routes, self._watch, self._limits)
        self._server = _Server(self._uvicorn_config(self._app))
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

    def _uvicorn_config(self, app: _App) -> uvicorn.Config:
        ssl_context = self._ssl
        guard = _Guard(self._limits.request_seconds, self._watch)
        config = uvicorn.Config(
            cast(Any, app),
            http=cast(
                type[asyncio.Protocol], type("_Protocol", (_GuardedProtocol,), {"guard": guard})
            ),
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
    This loop wakes once a second for the Date header, and ``exit_now()`` wakes it at once.
    """

    _loop: asyncio.AbstractEventLoop | None = None
    _wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        """Refresh the Date header every second until told to exit."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # on_tick does its per-second work on multiples of 10
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()

    def exit_now(self) -> None:
        """Ask the server to exit, from any thread."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)


class _EventLoop(asyncio.SelectorEventLoop):
    """An event loop whose servers get our TLS handshake deadline.

    uvicorn does not pass ``ssl_handshake_timeout`` (asyncio's default is 60 s), and a client
    that connects and never sends a ClientHello must not hold a socket that long.
    """

    def __init__(self, handshake_seconds: float) -> None:
        super().__init__()
        self._handshake_seconds = handshake_seconds

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        """Create a server as usual, with the handshake deadline when TLS is on."""
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self._handshake_seconds)
        return await super().create_server(*args, **kwargs)


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


@dataclass(frozen=True, slots=True)
class _Guard:
    request_seconds: float
    watch: WebConfigWatch

    def admits(self, transport: asyncio.BaseTransport) -> bool:
        tls = self.watch.last_good.tls
        if tls is None or not tls.client_allowed_sans:
            return True
        return peer_allowed(transport.get_extra_info("peercert"), tls.client_allowed_sans)


class _GuardedProtocol(HttpToolsProtocol):
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

    guard: ClassVar[_Guard]
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
        super().connection_lost(exc)

    def _receiving(self) -> bool:
        """Waiting on the client (for a request's head or body), not on our answer."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or cycle.more_body

    def _watch_request(self) -> None:
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

    def writelines(self, lines: Any) -> None:
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Workers:
    """A few threads for blocking calls, used under a deadline.

    A stuck callback occupies at most these threads and never piles up queued work.
    """

    def __init__(self, name: str, size: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix=name)
        self._free = asyncio.Semaphore(size)

    async def run(self, call: Callable[[], T], timeout: float) -> T:
        """Run ``call`` in a thread. Raises TimeoutError past ``timeout`` (queueing included)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            await self._free.acquire()
            future = loop.run_in_executor(self._executor, call)
            future.add_done_callback(self._finished)
            return await asyncio.shield(future)

    def _finished(self, future: asyncio.Future[Any]) -> None:
        self._free.release()
        if not future.cancelled():
            future.exception()  # retrieved here so an abandoned failure is not reported twice

    def close(self) -> None:
        """Stop accepting work; running calls are not waited for."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class _TokenBucket:
    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self._tokens = float(limit.burst)
        self._last = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        refill = (now - self._last) / self.limit.interval_seconds
        self._tokens = min(float(self.limit.burst), self._tokens + refill)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class _App:
    """The raw ASGI application: config check, rate limit, auth, then the route."""

    def __init__(self, routes: WebRoutes, watch: WebConfigWatch, limits: WebLimits) -> None:
        self._routes = routes
        self._watch = watch
        self._limits = limits
        self._handlers = _Workers("web-handler", HANDLER_THREADS)
        # exporter-toolkit serialises bcrypt too: it is CPU-bound and an easy DoS lever.
        self._bcrypt = _Workers("web-bcrypt", 1)
        self._users: tuple[WebConfig, BasicAuthUsers] | None = None
        self._rendered = _RenderedMetrics(routes.registry, routes.metrics_key)
        self._bucket: _TokenBucket | None = None
        self._logged: set[tuple[str, str]] = set()
        self._table: dict[str, Callable[[Scope], Awaitable[_Reply]]] = {
            "/metrics": self._metrics,
            "/status": self._status,
            "/": self._page,
            "/-/healthy": self._healthy,
            "/-/ready": self._ready,
        }

    def close(self) -> None:
        """Release the worker threads."""
        self._handlers.close()
        self._bcrypt.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one HTTP request."""
        if scope["type"] != "http":
            return
        reply = await self._reply(scope)
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers]
        headers.append((b"content-length", str(len(reply.body)).encode("ascii")))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})

    async def _reply(self, scope: Scope) -> _Reply:
        try:
            config = self._watch.current()
        except ConfigError:
            return _text(500, "web config file is invalid; see the exporter log\n")
        reply = await self._checked(scope, config)
        return _with_headers(reply, config.headers)

    async def _checked(self, scope: Scope, config: WebConfig) -> _Reply:
        if config.rate_limit is not None and not self._bucket_for(config.rate_limit).take():
            return _text(429, "Too Many Requests\n")
        if config.basic_auth_users and not await self._authorized(scope, config):
            return _text(401, "Unauthorized\n", ("WWW-Authenticate", "Basic"))
        route = self._table.get(scope["path"])
        if route is None:
            return _text(404, "Not Found\n")
        if scope["method"] not in _ALLOWED_METHODS:
            allow = ("Allow", ", ".join(_ALLOWED_METHODS))
            return _text(405, "Method Not Allowed\n", allow, ("Connection", "close"))
        return await route(scope)

    def _bucket_for(self, limit: RateLimit) -> _TokenBucket:
        if self._bucket is None or self._bucket.limit != limit:
            self._bucket = _TokenBucket(limit)
        return self._bucket

    async def _authorized(self, scope: Scope, config: WebConfig) -> bool:
        credentials = parse_basic_authorization(_header(scope, b"authorization"))
        if credentials is None:
            return False
        if self._users is None or self._users[0] is not config:
            self._users = (config, BasicAuthUsers(config.basic_auth_users))
        users = self._users[1]
        if users.cached(*credentials):
            return True
        try:
            return await self._bcrypt.run(
                lambda: users.verify(*credentials), self._limits.handler_seconds
            )
        except TimeoutError:
            return False

    async def _metrics(self, scope: Scope) -> _Reply:
        form = _MetricsForm.of(_header(scope, b"accept"), _header(scope, b"accept-encoding"))
        rendered = self._rendered
        # A body already rendered for this snapshot is answered on the loop: no thread hop.
        return rendered.cached(form) or await self._call(scope, lambda: rendered.render(form))

    async def _status(self, scope: Scope) -> _Reply:
        status = self._routes.status
        return await self._call(scope, lambda: _Reply(200, status(), _JSON))

    async def _page(self, scope: Scope) -> _Reply:
        page, csp = self._routes.page, self._routes.page_csp
        headers = (("Content-Type", "text/html; charset=utf-8"), ("Content-Security-Policy", csp))
        return await self._call(scope, lambda: _Reply(200, page(), headers))

    async def _healthy(self, scope: Scope) -> _Reply:
        return _text(200, "Healthy\n")  # answered on the loop: no callback can block it

    async def _ready(self, scope: Scope) -> _Reply:
        ready = self._routes.ready
        return await self._call(
            scope, lambda: _text(200, "Ready\n") if ready() else _text(503, "Not ready\n")
        )

    async def _call(self, scope: Scope, call: Callable[[], _Reply]) -> _Reply:
        path = scope["path"]
        try:
            return await self._handlers.run(call, self._limits.handler_seconds)
        except TimeoutError:
            self._log_once(path, "timeout")
            return _text(503, "Service Unavailable: handler timed out\n")
        except Exception as exc:  # a web handler is one of the places allowed to catch broadly
            self._log_once(path, type(exc).__name__)
            log.debug("web handler traceback path=%s", path, exc_info=True)
            return _text(500, "Internal Server Error\n")

    def _log_once(self, path: str, error: str) -> None:
        # Once per route and kind of failure: a broken callback must not log every scrape.
        if (path, error) not in self._logged:
            self._logged.add((path, error))
            log.error("web handler failed path=%s error=%s", path, error)


_TEXT: Final = (("Content-Type", "text/plain; charset=utf-8"),)
_JSON: Final = (("Content-Type", "application/json"),)


def _text(status: int, body: str, *extra: tuple[str, str]) -> _Reply:
    return _Reply(status, body.encode("utf-8"), (*_TEXT, *extra))


def _with_headers(reply: _Reply, extra: tuple[tuple[str, str], ...]) -> _Reply:
    if not extra:
        return reply
    overridden = {name.lower() for name, _ in extra}
    kept = tuple(h for h in reply.headers if h[0].lower() not in overridden)
    return replace(reply, headers=kept + extra)


def _header(scope: Scope, name: bytes) -> str:
    values = [v.decode("latin-1") for k, v in scope["headers"] if k == name]
    return ",".join(values)


@dataclass(frozen=True, slots=True)
class _MetricsForm:
    """How a scrape wants /metrics: the exposition format chosen from Accept, and gzip."""

    content_type: str
    gzip: bool
    encoder: Callable[[prometheus_client.CollectorRegistry], bytes]

    @staticmethod
    def of(accept: str, accept_encoding: str) -> _MetricsForm:
        """The form for these request headers (memoised: scrapers repeat their headers)."""
        return _metrics_form(accept, _accepts_gzip(accept_encoding))


@functools.lru_cache(maxsize=64)
def _metrics_form(accept: str, gzip_ok: bool) -> _MetricsForm:
    encoder, content_type = choose_encoder(accept)
    return _MetricsForm(content_type, gzip_ok, encoder)


class _RenderedMetrics:
    """/metrics bodies of the current snapshot, one per form, each rendered once.

    Renders happen in handler threads under one lock, so concurrent scrapes of a new snapshot
    render it once; ``cached()`` is a dict read, safe from the event loop.
    """

    _MAX_FORMS: Final = 8

    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry,
        key: Callable[[], object] | None,
    ) -> None:
        self._registry = registry
        self._key = key
        self._lock = threading.Lock()
        # (snapshot, bodies) swapped as one reference, so a reader never pairs them wrongly.
        self._bodies: tuple[object, dict[_MetricsForm, _Reply]] = (None, {})

    def cached(self, form: _MetricsForm) -> _Reply | None:
        """The body already rendered for the current snapshot, if any."""
        of, replies = self._bodies
        if self._key is None or self._key() is not of:
            return None
        return replies.get(form)

    def render(self, form: _MetricsForm) -> _Reply:
        """Render (or reuse) the body of the current snapshot; runs in a handler thread."""
        if self._key is None:
            return _render_metrics(self._registry, form)
        with self._lock:
            # Read before collecting: the body is then as new as the key or newer, never older.
            current = self._key()
            of, replies = self._bodies
            reply = replies.get(form) if current is of else None
            if reply is None:
                reply = _render_metrics(self._registry, form)
                kept = replies if current is of and len(replies) < self._MAX_FORMS else {}
                self._bodies = (current, {**kept, form: reply})
            return reply


def _render_metrics(registry: prometheus_client.CollectorRegistry, form: _MetricsForm) -> _Reply:
    body = form.encoder(registry)
    headers: tuple[tuple[str, str], ...] = (
        ("Content-Type", form.content_type),
        ("Vary", "Accept-Encoding"),
    )
    if form.gzip:
        body = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
        headers += (("Content-Encoding", "gzip"),)
    return _Reply(200, body, headers)


def _accepts_gzip(accept_encoding: str) -> bool:
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip"):
            continue
        q = params.strip().lower()
        return not (q.startswith("q=") and _quality(q[2:]) == 0)
    return False


def _quality(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


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

    @classmethod
    def adopt(cls, sock: socket.socket, limit: int) -> _CappedListener:
        """Take over a bound, listening socket."""
        capped = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        capped._limit, capped._open, capped._shedding = limit, [], False
        return capped

    def accept(self) -> tuple[socket.socket, Any]:
        """Accept one connection, or close it and report none when at the cap."""
        conn, address = super().accept()
        if len(self._open) >= self._limit:
            self._open = [r for r in self._open if (s := r()) is not None and s.fileno() != -1]
        if len(self._open) >= self._limit:
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


def _raise_open_files_limit() -> None:
    # As Go's runtime does since 1.19: a 1024 soft limit would let a connection flood make
    # accept() fail with EMFILE before the deadlines reclaim sockets.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        log.debug("raised open files limit from=%d to=%d", soft, wanted)
