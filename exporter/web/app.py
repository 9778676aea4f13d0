"""The exporter's ASGI application: /metrics, /status, /trail, /probe, /, /-/healthy, /-/ready.

Per request: the web config's check (500 while it is invalid), the rate limit, basic auth,
then the route; blocking work runs on a few threads under a deadline. Knows nothing of
sockets, TLS or uvicorn (``exporter.web.transport`` serves it).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import logging
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar
from urllib.parse import parse_qs

import prometheus_client
from prometheus_client.exposition import choose_encoder

from exporter.base.errors import ConfigError
from exporter.web.config import (
    BasicAuthUsers,
    RateLimit,
    WebConfig,
    WebConfigWatch,
    parse_basic_authorization,
)

log = logging.getLogger(__name__)
#: Kubernetes' liveness and readiness probes carry no credentials; these two paths tell only
#: whether the exporter is up and has sampled once, so they answer without basic auth.
UNAUTHENTICATED_PATHS: Final = frozenset({"/-/healthy", "/-/ready"})
T = TypeVar("T")

HANDLER_THREADS: Final = 4
GZIP_LEVEL: Final = 1
DEFAULT_PAGE_CSP: Final = "default-src 'self'"
_ALLOWED_METHODS: Final = ("GET", "HEAD")

# ASGI messages are dicts of arbitrary values by the spec.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class WebRoutes:
    """What the daemon provides to the web server.

    Attributes:
        registry: rendered at /metrics; its collectors must do no I/O.
        status: the JSON body of /status.
        trail: the JSON body of /trail (the movement of each target's starts).
        probe: a target's probe answer (status code, one line) for /probe?target=NAME.
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
    trail: Callable[[], bytes] = lambda: b'{"taken_at":null,"targets":[]}'
    probe: Callable[[str], tuple[int, str]] = lambda name: (503, "no sample yet")


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


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

    def _finished(self, future: asyncio.Future[T]) -> None:
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


class WebApp:
    """The raw ASGI application: config check, rate limit, auth, then the route."""

    def __init__(self, routes: WebRoutes, watch: WebConfigWatch, handler_seconds: float) -> None:
        self._routes = routes
        self._watch = watch
        self._handler_seconds = handler_seconds
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
            "/trail": self._trail,
            "/probe": self._probe,
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
        if config.basic_auth_users and scope["path"] not in UNAUTHENTICATED_PATHS:
            refused = await self._authorized(scope, config)
            if refused is not None:
                return refused
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

    async def _authorized(self, scope: Scope, config: WebConfig) -> _Reply | None:
        """None when the request may pass; else 401, or 503 when checks are queued too long."""
        unauthorized = _text(401, "Unauthorized\n", ("WWW-Authenticate", "Basic"))
        credentials = parse_basic_authorization(_header(scope, b"authorization"))
        if credentials is None:
            return unauthorized
        if self._users is None or self._users[0] is not config:
            self._users = (config, BasicAuthUsers(config.basic_auth_users))
        users = self._users[1]
        if users.cached(*credentials):
            return None
        started = time.monotonic()
        try:
            ok = await self._bcrypt.run(
                lambda: users.slowest_check_seconds >= 0 and users.verify(*credentials),
                self._handler_seconds,
            )
        except TimeoutError:  # queued behind other checks: not a wrong password
            return _text(
                503, "Service Unavailable: busy checking passwords\n", ("Retry-After", "1")
            )
        # Pad on the loop, not in the bcrypt worker: timing says nothing of who exists.
        await asyncio.sleep(max(0.0, users.slowest_check_seconds - (time.monotonic() - started)))
        return None if ok else unauthorized

    async def _metrics(self, scope: Scope) -> _Reply:
        form = _MetricsForm.of(_header(scope, b"accept"), _header(scope, b"accept-encoding"))
        rendered = self._rendered
        # A body already rendered for this snapshot is answered on the loop: no thread hop.
        return rendered.cached(form) or await self._call(scope, lambda: rendered.render(form))

    async def _status(self, scope: Scope) -> _Reply:
        status = self._routes.status
        return await self._call(scope, lambda: _Reply(200, status(), _JSON))

    async def _trail(self, scope: Scope) -> _Reply:
        trail = self._routes.trail
        return await self._call(scope, lambda: _Reply(200, trail(), _JSON))

    async def _probe(self, scope: Scope) -> _Reply:
        """``/probe?target=NAME``: 200 while its start progresses or it is up, else 503."""
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        names = query.get("target", [])
        if len(names) != 1:
            return _text(400, "ask for one target: /probe?target=NAME\n")
        status, body = self._routes.probe(names[0])
        return _text(status, body + "\n")

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
            return await self._handlers.run(call, self._handler_seconds)
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
