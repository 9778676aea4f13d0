"""HTTP probes of one target's health and completion endpoints, over a small HTTP/1.1 client.

Each probe is bounded by one total deadline and a body cap (after decompression); it never logs
bodies or the API key. ``X-Prometheus-Scrape-Timeout-Seconds`` does not apply: probes run on the
daemon's loop, not on demand for a scrape.

The probes speak HTTP/1.1 over a plain socket, their replies parsed by httptools (llhttp, the
parser the web server already uses): httpx's layers cost about 1 ms of CPU a request, most of
a target's tick, and h11's pure-Python parsing about 0.07 ms, a third of a kept-alive probe
(issue 18). The loop's requests reuse one kept-alive connection per target, as the engines'
servers (uvicorn, axum, cpp-httplib, Triton's) allow: a new TCP connection every tick was
the larger part of what is left. httpx still parses the target's URL, so a URL means here
what ``check-config`` (which asks httpx) judged it to mean.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import json
import logging
import os
import select
import socket
import ssl
import stat
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

import httptools
import httpx

from exporter import __version__
from exporter.base.errors import ConfigError
from exporter.base.model import EngineReport, ProbeKind, ProbeOutcome, ProbeResult
from exporter.config import Target
from exporter.engines import ReportKind
from exporter.sources import Scope
from exporter.sources.engine_reports import LIVE, REQUESTS, read_report

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES: Final = 65536
#: After a sleep-state endpoint answered 404 or 405, ask again only after this long.
SLEEP_RETRY_SECONDS: Final = 300.0
#: A ready server's live report is asked this often; one that gave none, after this long.
REPORT_EVERY_SECONDS: Final = 5.0
REPORT_RETRY_SECONDS: Final = 30.0
#: An engine's /metrics is larger than a health reply: its own, higher cap.
REPORT_MAX_BODY_BYTES: Final = 4 << 20
# wbits 32+15: zlib auto-detects a gzip or zlib header, so "deflate" sent zlib-wrapped works too.
_AUTO_WBITS: Final = 32 | zlib.MAX_WBITS
_DECODED_ENCODINGS: Final = frozenset({"gzip", "x-gzip", "deflate"})
#: Largest response head accepted: httpcore's limit, so a reply refused today is refused still.
_MAX_HEAD_BYTES: Final = 100 * 1024
_READ_BYTES: Final = 65536
_TCP_QUICKACK: Final[int | None] = getattr(socket, "TCP_QUICKACK", None)
# Events of httpcore's ``trace`` extension that hand over the connection's network stream.
# connect_unix_socket: the Docker Engine API's socket (exporter/discovery/docker.py).
_STREAM_EVENTS: Final = frozenset(
    {
        "connection.connect_tcp.complete",
        "connection.connect_unix_socket.complete",
        "connection.start_tls.complete",
    }
)


class _Failed(Exception):
    """An exchange that gave no complete response, with the outcome that says why."""

    def __init__(self, outcome: ProbeOutcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class _BodyTooLarge(Exception):
    """The decoded body passed the byte cap."""


class _Expired(Exception):
    """The probe's total deadline passed before the reply was complete."""


@dataclass(slots=True)
class _Reply:
    """What arrived of a response so far (mutable while the probe runs)."""

    status: int | None = None
    body: bytes = b""


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


class _BodyDecoder:
    """Decodes gzip/deflate incrementally, never producing more than the cap allows.

    httpx's ``iter_bytes()`` inflates a whole network read at once: one 64 KiB chunk of a gzip
    bomb becomes about 64 MB in memory before any cap can be checked.
    """

    def __init__(self, encoding: str, cap: int) -> None:
        self._inflate = encoding in _DECODED_ENCODINGS
        self._zlib = zlib.decompressobj(_AUTO_WBITS)
        self._room = cap
        self.body = bytearray()

    def feed(self, chunk: bytes) -> None:
        """Add one raw chunk.

        Raises:
            _BodyTooLarge: the decoded body would pass the cap.
            zlib.error: the compressed stream is corrupt.
        """
        while chunk:
            if not self._inflate:
                out, chunk = chunk, b""
            else:
                # max_length one past the room tells "exactly full" from "too large".
                out = self._zlib.decompress(chunk, self._room + 1)
                chunk = self._zlib.unconsumed_tail or self._next_member()
            if len(out) > self._room:
                raise _BodyTooLarge
            self._room -= len(out)
            self.body += out

    def _next_member(self) -> bytes:
        # A gzip body may hold several members back to back (RFC 1952 section 2.2).
        if not self._zlib.eof or not self._zlib.unused_data:
            return b""
        rest = self._zlib.unused_data
        self._zlib = zlib.decompressobj(_AUTO_WBITS)
        return rest


def _content_encoding(headers: Iterable[tuple[bytes, bytes]]) -> str:
    # Repeated headers join with ", " as httpx's headers.get did: "gzip, br" is refused whole.
    values = [value.decode("latin-1") for name, value in headers if name == b"content-encoding"]
    encoding = ", ".join(values).strip().lower()
    if encoding not in _DECODED_ENCODINGS | {"identity", ""}:
        raise zlib.error("unsupported content-encoding")
    return encoding


@dataclass(frozen=True, slots=True)
class _Route:
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


def _route(base_url: str, path: str) -> _Route:
    """The route httpx's ``Client(base_url=...)`` would take for ``path``.

    httpx (as ``check-config`` does) parses the URL: IDNA host names, IPv6 literals and
    percent-encoding mean the same as before; a base path prefixes the probe's path.
    """
    base = httpx.URL(base_url)
    if not base.raw_path.endswith(b"/"):
        base = base.copy_with(raw_path=base.raw_path + b"/")
    url = base.copy_with(raw_path=base.raw_path + httpx.URL(path).raw_path.lstrip(b"/"))
    tls = url.scheme == "https"
    return _Route(
        host=url.raw_host.decode("ascii"),
        port=url.port or (443 if tls else 80),
        tls=tls,
        target=url.raw_path,
        host_header=url.netloc,
    )


class _Malformed(Exception):
    """The reply broke HTTP/1.1: a bad or oversized head, or a body that ended early."""


class _Response:
    """One response as llhttp (through httptools) parses it: the parser's callbacks fill it in.

    Interim 1xx responses are skipped, as httpcore did. Anything after the response's end (a
    second response, or bytes that are none) marks it ``after``: a connection with such bytes
    is never reused, since they would be read as the next reply.
    """

    __slots__ = (
        "after",
        "chunks",
        "complete",
        "headers",
        "interim",
        "keep_alive",
        "parser",
        "status",
    )

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        # A bare LF may end a line, as h11 allowed; every other rule of llhttp stays strict.
        self.parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        self.status: int | None = None  # the final response's, once its head is complete
        self.headers: list[tuple[bytes, bytes]] = []  # names lower-cased
        self.chunks: list[bytes] = []  # body bytes parsed and not yet taken
        self.interim = False
        self.complete = False
        self.keep_alive = False
        self.after = False

    def feed(self, data: bytes) -> None:
        """Parse the bytes of one read.

        Raises:
            _Malformed: the bytes are not a valid response (or switch protocols unasked).
        """
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise _Malformed("the server switched protocols unasked") from None
        except httptools.HttpParserError as exc:
            if not self.complete:
                raise _Malformed(f"invalid reply: {exc}") from None
            self.after = True  # bytes past the reply that are not HTTP

    def end_of_stream(self) -> None:
        """The peer closed: a body delimited by the close ends here.

        Raises:
            _Malformed: the head or a body of known length ended early.
        """
        if self.complete:
            return
        if self.status is None or not self._delimited_by_close():
            raise _Malformed("the reply ended early")
        self.complete = True  # and keep_alive stays False: the connection is over

    def _delimited_by_close(self) -> bool:
        codings = b",".join(value for name, value in self.headers if name == b"transfer-encoding")
        chunked = codings.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        return not chunked and all(name != b"content-length" for name, _ in self.headers)

    # The parser's callbacks (httptools' HTTPProtocol); they never raise.

    def on_message_begin(self) -> None:
        """A response starts; one after the complete reply is bytes past it."""
        if self.complete:
            self.after = True

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header of the head being read."""
        if not self.complete:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        """The head is complete: a 1xx is set aside, a final status is kept."""
        if self.complete:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # 101 raises HttpParserUpgrade after this
            self.interim, self.headers = True, []
        else:
            self.status = status

    def on_body(self, body: bytes) -> None:
        """Body bytes, already de-chunked."""
        if not self.complete:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        """The response ended; whether the connection may carry another."""
        if self.interim:
            self.interim = False
        elif not self.complete:
            self.complete = True
            # HTTP/1.0 closes after the reply, as h11 had it, even with "Connection: keep-alive".
            self.keep_alive = (
                self.parser.should_keep_alive() and self.parser.get_http_version() == "1.1"
            )


class _Connection:
    """One HTTP/1.1 connection: a connected socket, the response being read, its origin."""

    __slots__ = ("eof", "origin", "read_whole", "received", "response", "sock")

    def __init__(self, sock: socket.socket, origin: tuple[str, int, bool]) -> None:
        self.sock = sock
        self.origin = origin
        self.response = _Response()
        self.received = 0  # bytes of the current exchange's response read so far
        self.eof = False  # the last read met the end of the stream
        self.read_whole = False  # the current response was read to its end

    def begin(self) -> None:
        """Make ready for the next exchange's response."""
        self.response = _Response()
        self.received, self.eof, self.read_whole = 0, False, False

    def read_head(self, deadline: float) -> int:
        """The final response's status, reading as needed (1xx skipped).

        Raises:
            _Expired: the deadline passed between reads.
            _Malformed: the reply is malformed, too large a head, or ended early.
            OSError: the connection failed (TimeoutError when a read ran out of time).
        """
        while self.response.status is None:
            self._read(deadline)
        return self.response.status

    def read_body(self, deadline: float, decoder: _BodyDecoder) -> None:
        """The rest of the response into ``decoder``; raises as ``read_head`` and the decoder."""
        response = self.response
        while True:
            chunks, response.chunks = response.chunks, []
            for chunk in chunks:
                decoder.feed(chunk)
            if response.complete:
                break
            self._read(deadline)
        self.read_whole = True

    def _read(self, deadline: float) -> None:
        """One read into the parser, bounded by the time left."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Expired
        self.sock.settimeout(remaining)
        if self.received:  # the reply came in parts: acknowledge what came at once
            _ack_at_once(self.sock)
        data = self.sock.recv(_READ_BYTES)
        self.received += len(data)
        if not data:
            self.eof = True
            self.response.end_of_stream()
            return
        self.response.feed(data)
        if self.response.status is None and self.received > _MAX_HEAD_BYTES:
            raise _Malformed("the reply's head passed the size limit")

    def reusable(self) -> bool:
        """True when the exchange ended cleanly and nothing followed it: fit for the next one.

        Anything else (``Connection: close`` or HTTP/1.0; a body left unread; bytes past the
        reply) leaves a state no next request can start from.
        """
        response = self.response
        return self.read_whole and response.keep_alive and not response.after

    def idle(self) -> bool:
        """True when nothing arrived since the last exchange ended.

        Readable while idle means the peer closed it (uvicorn does after 5 s idle) or sent
        something unasked: either way no request should go over it. poll, not select: a
        daemon watching many targets may hold descriptors past select's 1024.
        """
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return False  # decrypted already, so the descriptor alone would not show it
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        """Close the socket; the caller has made sure no watchdog still watches it."""
        self.sock.close()


def _stale(conn: _Connection, exc: BaseException) -> bool:
    """True when ``conn`` failed before any byte of the response arrived, as a closed one does.

    The send broke (EPIPE, ECONNRESET) or the first read met an end of file or a reset: a
    server closing its idle connection as the request went out looks exactly like this.
    """
    if conn.received:
        return False
    if conn.eof or isinstance(exc, ssl.SSLEOFError):  # SSLEOFError: TLS's unclean end of file
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ECONNRESET)


def _ack_at_once(sock: socket.socket) -> None:
    """Acknowledge what arrived now rather than in 40 ms (Linux; a no-op elsewhere).

    A server that writes its head and body apart with Nagle on (no TCP_NODELAY) holds the
    body until the head is acknowledged, and on a kept connection Linux delays that ACK by
    up to 40 ms; a fresh connection's first segments are acknowledged at once, which hid
    this. Setting TCP_QUICKACK sends an ACK the kernel holds back; the flag is not sticky,
    so it is set before each further read of a reply that came in parts, and only then.
    """
    if _TCP_QUICKACK is not None:
        with contextlib.suppress(OSError):  # not TCP (a test's unix socket): nothing to do
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)


class _Stale(Exception):
    """A reused connection that the server had closed: one fresh connection is tried."""


@dataclass(frozen=True, slots=True)
class _Request:
    """One request as the exchange sends it, the same on a retry."""

    method: str
    route: _Route
    content: bytes | None
    cap: int  # the body cap, after decompression
    keep: bool  # over the kept connection, and kept after when it ended cleanly


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both derive from it
        return None


def says_loading(status: int, body: bytes) -> bool:
    """True when a reply says the engine is still loading its model.

    llama.cpp answers ``503 {"error":{"message":"Loading model",...}}``; builds from 2024
    answered ``503 {"status": "loading model"}`` (ENGINES.md section 3, REAL-ENGINES.md 4).
    """
    data = _json(body) if status == 503 else None
    if not isinstance(data, dict):
        return False
    error = data.get("error")
    texts = (error.get("message") if isinstance(error, dict) else None, data.get("status"))
    return any(isinstance(t, str) and "loading" in t.lower() for t in texts)


def says_sleeping(status: int, body: bytes) -> bool | None:
    """The sleep state in a ``/is_sleeping`` reply (vLLM: ``{"is_sleeping": true}``), else None."""
    data = _json(body) if 200 <= status < 300 else None
    value = data.get("is_sleeping") if isinstance(data, dict) else None
    return value if isinstance(value, bool) else None


def has_choices(body: bytes) -> bool:
    """True when a completion reply is JSON with a non-empty ``choices`` list."""
    data = _json(body)
    return (
        isinstance(data, dict) and isinstance(data.get("choices"), list) and bool(data["choices"])
    )


def _body_ignored(status: int) -> bool:
    """Redirect and auth replies are judged by status alone; their bodies are not read."""
    return 300 <= status < 400 or status in (401, 403)


def _judge(kind: ProbeKind, reply: _Reply) -> ProbeResult:
    """Outcome of a complete response; ``at`` and duration are filled in by the caller."""
    status = reply.status or 0
    choices = False
    loading = False
    if _body_ignored(status):
        outcome = ProbeOutcome.REDIRECT if status < 400 else ProbeOutcome.UNAUTHORIZED
    elif not 200 <= status < 300:
        outcome = ProbeOutcome.HTTP_STATUS
        loading = says_loading(status, reply.body)
    elif kind is ProbeKind.HEALTH:
        outcome = ProbeOutcome.OK  # vLLM answers 200 with an empty body
    else:
        choices = has_choices(reply.body)
        outcome = ProbeOutcome.OK if choices else ProbeOutcome.BAD_BODY
    return ProbeResult(kind, outcome, reply.status, 0.0, 0.0, has_choices=choices, loading=loading)


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _classify(exc: Exception, expired: bool) -> ProbeOutcome:
    """Bounded outcome of a probe that ended in an exception."""
    if expired or isinstance(exc, TimeoutError | _Expired):
        return ProbeOutcome.TIMEOUT
    if isinstance(exc, _BodyTooLarge):
        return ProbeOutcome.BODY_TOO_LARGE
    if isinstance(exc, zlib.error):
        return ProbeOutcome.BAD_BODY
    chain = _causes(exc)
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return ProbeOutcome.TLS
    if any(isinstance(e, OSError) and e.errno == errno.ECONNREFUSED for e in chain):
        return ProbeOutcome.REFUSED
    return ProbeOutcome.ERROR


def _read_key_file(path: str) -> str:
    try:
        with open(path, "rb") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            if mode & stat.S_IROTH:
                raise ConfigError(
                    path, "api_key_file", f"is readable by other users (mode {mode:04o}); chmod 600"
                )
            raw = f.read(4097)
    except OSError as exc:
        raise ConfigError(path, "api_key_file", f"cannot read: {exc.strerror}") from None
    return raw.decode("ascii", errors="replace").strip()  # U+FFFD fails the ASCII check


def load_api_key(target: Target) -> str | None:
    """The target's API key from ``api_key_file`` or ``api_key_env``; None when neither is set.

    The key never appears in an error message.

    Raises:
        ConfigError: the file is readable by other users, unreadable, or the key is empty
            or not one line of printable ASCII; or the environment variable is unset.
    """
    if target.api_key_file:
        where, field = target.api_key_file, "api_key_file"
        key = _read_key_file(target.api_key_file)
    elif target.api_key_env:
        where, field = f"${target.api_key_env}", "api_key_env"
        key = os.environ.get(target.api_key_env, "").strip()
    else:
        return None
    if not key:
        raise ConfigError(where, field, "is empty or not set")
    if len(key) > 4096 or not (key.isascii() and key.isprintable()) or " " in key:
        raise ConfigError(where, field, "must hold one line of printable ASCII without spaces")
    return key


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


class Prober:
    """Health and completion probes of one target over HTTP/1.1.

    The health probe and what ``sample`` asks after it (sleep state, engine report) share one
    kept-alive connection, reused across ticks while every exchange on it ends cleanly and it
    stays quiet while idle; anything else closes it and the next request connects afresh. The
    completion probe runs in another thread: it opens a connection of its own per call and
    closes it after.

    Every call makes one request (no redirects, no proxy: nothing reads the environment),
    retried once in one case only: when a reused kept connection fails before any byte of
    the response arrived (the send breaks with EPIPE or ECONNRESET, or the first read meets
    an end of file or a reset: the server closed it as it was reused), the request is sent
    once more over a fresh connection, within the same total deadline. Never after a fresh
    connection failed, never once response bytes arrived, never for the completion probe.
    Each call returns within ``target.probe_timeout_seconds`` plus scheduling slack. As a
    ``Source`` (``sample``) it is the health probe; the completion probe can take seconds,
    so the daemon runs it beside the loop rather than in a tick.
    """

    name: Final = "probe"
    scope: Final = Scope.TARGET

    def __init__(
        self,
        target: Target,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        ca_file: str | None = None,
    ) -> None:
        """Prepare the probes' headers and TLS context; reads the API key once.

        Raises:
            ConfigError: the API key or CA file cannot be used (see ``load_api_key``).
        """
        self._target = target
        self._timeout = target.probe_timeout_seconds
        self._cap = max_body_bytes
        self._completion_path = target.profile.completion_path
        headers = [
            (b"User-Agent", f"inference-lifecycle-exporter/{__version__}".encode()),
            (b"Accept", b"application/json"),
            (b"Accept-Encoding", b"gzip, deflate"),
        ]
        key = load_api_key(target)
        if key is not None:
            headers.append((b"Authorization", f"Bearer {key}".encode("ascii")))
        self._headers: Final = tuple(headers)
        health = _route(target.base_url, target.health_path)
        # Every path shares the base URL's scheme; loading the system CA store costs about
        # 1 MiB of native memory, which a plain-HTTP fleet never needs.
        self._tls: Final = _ssl_context(ca_file) if health.tls or ca_file else None
        # By path, a handful per target; the health path's now, as check-config vouched for it.
        self._routes = {target.health_path: health}
        self._last: dict[ProbeKind, ProbeOutcome] = {}
        self._sleep_retry_at = 0.0
        self._report: EngineReport | None = None
        self._report_final = False
        self._report_due = 0.0
        # The loop's kept connection. Taken out while a request uses it, so close() (another
        # thread's, at shutdown, even while a stuck sample runs) never closes a socket in use.
        self._kept: _Connection | None = None
        self._kept_lock: Final = threading.Lock()
        self._closed = False

    def probe_health(self) -> ProbeResult:
        """GET the engine's health path over the kept connection; OK on any 2xx. Never raises."""
        return self._probe(ProbeKind.HEALTH, "GET", self._target.health_path, None, self._timeout)

    def sample(self, deadline: float | None = None) -> ProbeResult:
        """The health probe as the loop's source; the probe timeout bounds it.

        After a good health probe of an engine with a sleep mode, the same budget also asks
        whether it sleeps (vLLM answers 200 to ``/health`` while asleep). Every request goes
        over the kept connection. Never called concurrently with itself (the runner starts no
        source whose last call still runs).
        """
        health = self.probe_health()
        if health.ok and self._target.profile.sleep_path is not None:
            budget = self._timeout - health.duration_seconds
            health = replace(health, sleeping=self._ask_sleeping(budget))
        report = self._engine_report(health)
        return health if report is None else replace(health, report=report)

    def _engine_report(self, health: ProbeResult) -> EngineReport | None:
        """What the engine reports on its own startup, asked when it can say something new.

        A live report (Triton's per-model states) is asked on every tick the server answers
        until it is ready, then every ``REPORT_EVERY_SECONDS``; a summary (TensorRT-LLM's and
        SGLang's startup seconds) once the server is ready, again after a restart. Between
        asks the last report stands; a server that stopped answering has none.
        """
        kind = self._target.profile.report
        if kind is None:
            return None
        if health.status_code is None:  # not listening: a new instance reports anew
            self._report, self._report_final = None, False
            return None
        now = time.monotonic()
        if kind in LIVE:
            due = not health.ok or now >= self._report_due
        else:
            due = health.ok and not self._report_final and now >= self._report_due
        if due:
            budget = self._timeout - health.duration_seconds - (time.monotonic() - now)
            fetched = self._fetch_report(kind, budget)
            self._report_due = now + (REPORT_EVERY_SECONDS if fetched else REPORT_RETRY_SECONDS)
            if fetched is not None:
                self._report, self._report_final = fetched, kind not in LIVE
        return self._report

    def _fetch_report(self, kind: ReportKind, budget: float) -> EngineReport | None:
        method, path, body = REQUESTS[kind]
        reply = _Reply()
        try:
            self._request(
                method, path, body, reply, max(budget, 0.05), REPORT_MAX_BODY_BYTES, keep=True
            )
        except _Failed:
            return None
        if reply.status is None or not 200 <= reply.status < 300:
            return None  # not offered by this version or these flags: normal, never an error
        return read_report(kind, reply.body)

    def probe_completion(self) -> ProbeResult:
        """POST a tiny greedy completion; OK only on 2xx JSON with ``choices``. Never raises.

        Over a fresh connection of its own, closed after: it runs beside the loop's requests.
        """
        probe = self._target.completion
        if probe is None:
            return ProbeResult(ProbeKind.COMPLETION, ProbeOutcome.ERROR, None, 0.0, time.time())
        payload = {
            "model": probe.model,
            "prompt": probe.prompt,
            "max_tokens": probe.max_tokens,
            "temperature": 0,
        }
        return self._probe(
            ProbeKind.COMPLETION,
            "POST",
            self._completion_path,
            json.dumps(payload).encode(),
            probe.timeout_seconds,
        )

    def close(self) -> None:
        """Close the kept connection; a request still running then keeps nothing after it."""
        with self._kept_lock:
            self._closed = True
            kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()  # idle: no watchdog watches it
        self._routes.clear()

    def _probe(
        self, kind: ProbeKind, method: str, path: str, content: bytes | None, timeout: float
    ) -> ProbeResult:
        started = time.monotonic()
        reply = _Reply()
        try:
            self._request(method, path, content, reply, timeout, keep=kind is ProbeKind.HEALTH)
            result = _judge(kind, reply)
        except _Failed as failed:  # the probe's contract: an outcome, never an exception
            result = ProbeResult(kind, failed.outcome, reply.status, 0.0, 0.0)
        result = replace(result, duration_seconds=time.monotonic() - started, at=time.time())
        self._log_edge(result)
        return result

    def _request(
        self,
        method: str,
        path: str,
        content: bytes | None,
        reply: _Reply,
        timeout: float,
        cap: int | None = None,
        *,
        keep: bool,
    ) -> None:
        """One bounded exchange into ``reply``; any failure as ``_Failed`` with its outcome.

        With ``keep`` it goes over the kept connection (and keeps it for the next when it
        ended cleanly); otherwise over a fresh connection, closed after.
        """
        dog = Watchdog(timeout)
        try:
            deadline = time.monotonic() + timeout
            self._exchange(method, path, content, reply, deadline, dog, cap or self._cap, keep)
        except Exception as exc:
            outcome = _classify(exc, dog.fired)
            if outcome is ProbeOutcome.ERROR:
                log.debug(
                    "probe error target=%s path=%s error=%s",
                    self._target.name,
                    path,
                    type(exc).__name__,
                )
            raise _Failed(outcome) from exc
        finally:
            dog.disarm()

    def _ask_sleeping(self, budget: float) -> bool | None:
        """Whether the engine says it sleeps; None when it does not say (never an error).

        vLLM offers ``/is_sleeping`` only with ``VLLM_SERVER_DEV_MODE=1``: a 404 or 405 means
        not offered, asked again after ``SLEEP_RETRY_SECONDS`` (a restart may turn it on).
        """
        path = self._target.profile.sleep_path
        if path is None or time.monotonic() < self._sleep_retry_at:
            return None
        reply = _Reply()
        try:
            self._request("GET", path, None, reply, max(budget, 0.05), keep=True)
        except _Failed:
            return None
        if reply.status in (404, 405):
            self._sleep_retry_at = time.monotonic() + SLEEP_RETRY_SECONDS
            log.info(
                "sleep state not offered target=%s path=%s status=%s "
                "(vLLM offers it with VLLM_SERVER_DEV_MODE=1); asking again in %gs",
                self._target.name,
                path,
                reply.status,
                SLEEP_RETRY_SECONDS,
            )
            return None
        return says_sleeping(reply.status or 0, reply.body)

    def _exchange(
        self,
        method: str,
        path: str,
        content: bytes | None,
        reply: _Reply,
        deadline: float,
        dog: Watchdog,
        cap: int,
        keep: bool,
    ) -> None:
        route = self._routes.get(path)
        if route is None:
            route = self._routes[path] = _route(self._target.base_url, path)
        request = _Request(method, route, content, cap, keep)
        kept = self._take_kept(route) if keep else None
        if kept is not None:
            try:
                self._over(kept, request, reply, deadline, dog, reused=True)
                return
            except _Stale:
                if time.monotonic() >= deadline:  # the one fresh try stays inside the deadline
                    raise _Expired from None
        sock = self._connect(route, deadline, dog)
        self._over(_Connection(sock, route.origin), request, reply, deadline, dog, reused=False)

    def _over(
        self,
        conn: _Connection,
        request: _Request,
        reply: _Reply,
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
            stale = reused and _stale(conn, exc)
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
                raise _Expired
            return
        self._keep(conn)

    def _send_and_read(
        self, conn: _Connection, request: _Request, reply: _Reply, deadline: float
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
        if not _body_ignored(reply.status):  # an unread body: the connection is closed
            decoder = _BodyDecoder(_content_encoding(conn.response.headers), request.cap)
            conn.read_body(deadline, decoder)
            reply.body = bytes(decoder.body)

    def _take_kept(self, route: _Route) -> _Connection | None:
        """The kept connection when it goes to ``route``'s origin and stayed quiet; else None."""
        with self._kept_lock:
            kept, self._kept = self._kept, None
        if kept is None:
            return None
        if kept.origin == route.origin and kept.idle():
            return kept
        kept.close()  # idle: no watchdog watches it
        return None

    def _keep(self, conn: _Connection) -> None:
        """Keep ``conn`` for the next request, unless the prober was closed meanwhile."""
        with self._kept_lock:
            if self._closed or self._kept is not None:
                spare: _Connection | None = conn
            else:
                self._kept, spare = conn, None
        if spare is not None:
            spare.close()

    def _connect(self, route: _Route, deadline: float, dog: Watchdog) -> socket.socket:
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

    def _log_edge(self, result: ProbeResult) -> None:
        if self._last.get(result.kind) is result.outcome:
            return
        self._last[result.kind] = result.outcome
        log.debug(
            "probe outcome changed target=%s probe=%s outcome=%s status=%s loading=%s",
            self._target.name,
            result.kind,
            result.outcome,
            result.status_code,
            result.loading,
        )
