"""Loopback HTTP(S) servers for tests: real sockets on 127.0.0.1:0 (or a unix socket), routes
chosen per test.

Routes are plain callables made by the factories below (``reply``, ``trickle``, ``endless``,
``gzip_bomb``, ``redirect``, ``hang``). A server records what it saw and joins its threads on close.
It speaks HTTP/1.0 unless made with ``keep_alive``: then HTTP/1.1 with kept connections, as the
engines' own servers answer.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import socketserver
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socket import AF_UNIX, SHUT_RDWR, socket
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Route = Callable[["Exchange"], None]


@dataclass(frozen=True)
class RecordedRequest:
    """One request a server received; header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a throw-away CA and a server certificate it signed."""

    ca_file: str
    cert_file: str
    key_file: str


class Exchange(BaseHTTPRequestHandler):
    """One request as a route sees it: ``command``, ``path``, ``headers``, ``body``."""

    server: _Server
    protocol_version = "HTTP/1.0"  # close-delimited bodies: endless streams need no chunking
    timeout = 5.0  # a silent client must not hold a thread past the test
    body = b""
    #: Requests this connection carried so far, the current one included (1: a fresh one).
    requests_on_connection = 0

    def setup(self) -> None:
        """Take the server's protocol (and idle timeout) before the connection is read."""
        owner = self.server.owner
        if owner.keep_alive:
            self.protocol_version = "HTTP/1.1"
            self.timeout = owner.idle_timeout
        super().setup()
        owner.track(self.connection)

    def finish(self) -> None:
        """Forget the connection: it is closed after this."""
        try:
            super().finish()
        finally:
            self.server.owner.untrack(self.connection)

    @property
    def stopping(self) -> threading.Event:
        """Set when the server closes; long-running routes wait on it."""
        return self.server.owner.stopping

    def send_head(self, status: int, headers: Mapping[str, str]) -> None:
        """Send the status line and headers."""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def write(self, data: bytes) -> bool:
        """Send raw bytes; False once the client has gone away."""
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # BrokenPipe, ConnectionReset, TimeoutError, SSL errors
            return False
        self.server.owner.bytes_sent += len(data)
        return True

    def _dispatch(self) -> None:
        self.requests_on_connection += 1
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        owner = self.server.owner
        headers = {k.lower(): v for k, v in self.headers.items()}
        owner.requests.append(RecordedRequest(self.command, self.path, headers, self.body))
        route = owner.routes.get(urlsplit(self.path).path, reply(404, {"error": "not found"}))
        try:
            route(self)
        except OSError:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _dispatch

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests read ``requests`` instead."""


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # joined on close, so no socket outlives the test
    block_on_close = True
    request_queue_size = 128

    def __init__(self, owner: LoopbackServer, tls: ssl.SSLContext | None, port: int = 0) -> None:
        self.owner = owner
        self.tls = tls
        super().__init__(("127.0.0.1", port), Exchange)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.owner.connections += 1  # serve_forever's thread only: no lock needed
        return True

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(Exchange.timeout)
        try:  # handshake in the connection's thread, never in the accept loop
            wrapped = self.tls.wrap_socket(request, server_side=True)
        except OSError:  # the client refused our certificate, or left
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            wrapped.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that vanish mid-reply are what these tests are about; no tracebacks."""


class _UnixServer(_Server):
    """The same server on a unix socket (the Docker Engine API's transport)."""

    address_family = AF_UNIX

    def __init__(self, owner: LoopbackServer, path: str) -> None:
        self.owner = owner
        self.tls = None
        # typeshed types TCPServer's address as (host, port); AF_UNIX takes a path.
        socketserver.TCPServer.__init__(self, path, Exchange)  # type: ignore[arg-type]

    def server_bind(self) -> None:
        # HTTPServer.server_bind splits a (host, port) pair; a unix socket has a path.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", 0


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 with an ephemeral port; use it as a context manager.

    Attributes:
        url: ``http://127.0.0.1:PORT`` (``https`` with ``tls``).
        routes: path -> route; unknown paths answer 404. May be changed while running.
        requests: every request received, in order.
        connections: TCP connections accepted.
        bytes_sent: body bytes routes wrote successfully.
        stopping: set by ``close()``; ``hang`` and ``trickle`` return when it is.
        keep_alive: HTTP/1.1 with kept connections (``keep_alive=True``), else HTTP/1.0.
        idle_timeout: with ``keep_alive``, a connection idle this long is closed by the server.
    """

    def __init__(
        self,
        routes: Mapping[str, Route] | None = None,
        *,
        tls: TlsFiles | None = None,
        unix_socket: str | None = None,
        keep_alive: bool = False,
        idle_timeout: float = Exchange.timeout,
        port: int = 0,
    ) -> None:
        self.routes: dict[str, Route] = dict(routes or {})
        self.requests: list[RecordedRequest] = []
        self.connections = 0
        self.bytes_sent = 0
        self.stopping = threading.Event()
        self.keep_alive = keep_alive
        self.idle_timeout = idle_timeout
        self._open: set[socket] = set()  # connections a handler serves now
        self._open_lock = threading.Lock()
        if unix_socket is not None:  # ``url`` is then only a placeholder host
            self._httpd: _Server = _UnixServer(self, unix_socket)
            self.port = 0
        else:
            self._httpd = _Server(self, _server_context(tls) if tls else None, port)
            self.port = int(self._httpd.server_address[1])
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving, release waiting routes and join every thread."""
        self.stopping.set()
        self._httpd.shutdown()
        with self._open_lock:  # a kept connection's handler waits for its next request: end it
            for conn in self._open if self.keep_alive else ():
                _hang_up(conn)
        self._httpd.server_close()
        self._thread.join()

    def track(self, conn: socket) -> None:
        """Remember a connection being served (hung up at once if the server is closing)."""
        with self._open_lock:
            self._open.add(conn)
            if self.keep_alive and self.stopping.is_set():
                _hang_up(conn)

    def untrack(self, conn: socket) -> None:
        """Forget a connection whose handler is done."""
        with self._open_lock:
            self._open.discard(conn)

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hang_up(conn: socket) -> None:
    # The base method: SSLSocket.shutdown would also drop the SSL object its handler uses.
    with contextlib.suppress(OSError):  # already gone
        socket.shutdown(conn, SHUT_RDWR)


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _encode(body: bytes | str | Mapping[str, Any] | list[Any]) -> tuple[bytes, str]:
    if isinstance(body, bytes):
        return body, "application/octet-stream"
    if isinstance(body, str):
        return body.encode(), "text/plain; charset=utf-8"
    return json.dumps(body).encode(), "application/json"


def reply(
    status: int = 200,
    body: bytes | str | Mapping[str, Any] | list[Any] = b"",
    *,
    headers: Mapping[str, str] | None = None,
) -> Route:
    """A complete response; a dict or list body is sent as JSON."""
    payload, content_type = _encode(body)
    head = {"Content-Type": content_type, "Content-Length": str(len(payload)), **(headers or {})}

    def route(ex: Exchange) -> None:
        ex.send_head(status, head)
        ex.write(payload)

    return route


def trickle(
    interval: float, *, status: int = 200, count: int = 1000, head_too: bool = False
) -> Route:
    """One byte every ``interval`` seconds; with ``head_too`` the status line drips as well."""
    head = f"HTTP/1.0 {status} X\r\nContent-Type: text/plain\r\n\r\n".encode()

    def route(ex: Exchange) -> None:
        if not head_too:
            ex.send_head(status, {"Content-Type": "text/plain"})
        drops = [head[i : i + 1] for i in range(len(head))] if head_too else []
        for drop in drops + [b"x"] * count:
            if ex.stopping.wait(interval) or not ex.write(drop):
                return

    return route


def endless(total_bytes: int = 1 << 30, *, chunk_bytes: int = 1 << 16) -> Route:
    """A 200 whose body of ``total_bytes`` streams as fast as the client reads."""
    chunk = b"x" * chunk_bytes

    def route(ex: Exchange) -> None:
        ex.send_head(200, {"Content-Type": "text/plain", "Content-Length": str(total_bytes)})
        left = total_bytes
        while left > 0 and not ex.stopping.is_set():
            if not ex.write(chunk[:left]):
                return
            left -= chunk_bytes

    return route


def gzip_zeros(decompressed_bytes: int) -> bytes:
    """A gzip member that inflates to ``decompressed_bytes`` zero bytes (about 1000:1)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    out = []
    for start in range(0, decompressed_bytes, len(block)):
        out.append(packer.compress(block[: decompressed_bytes - start]))
    out.append(packer.flush())
    return b"".join(out)


def gzip_bomb(decompressed_bytes: int = 32 << 20, *, status: int = 200) -> Route:
    """A small ``Content-Encoding: gzip`` body that inflates to ``decompressed_bytes``."""
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    return reply(status, gzip_zeros(decompressed_bytes), headers=headers)


def redirect(location: str, status: int = 302) -> Route:
    """A redirect to ``location``."""
    return reply(status, b"", headers={"Location": location})


def hang() -> Route:
    """Read the request, then answer nothing until the server closes."""

    def route(ex: Exchange) -> None:
        ex.stopping.wait()

    return route


def _server_context(tls: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def _write_pem(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    path.chmod(0o600)
    return str(path)


def _cert(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None = None
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def make_tls_files(directory: Path) -> TlsFiles:
    """A test CA and a server certificate for ``localhost`` and ``127.0.0.1``, as PEM files."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _cert("test CA", ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = (
        _cert("localhost", key, ca.subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return TlsFiles(
        ca_file=_write_pem(directory / "ca.pem", ca.public_bytes(pem)),
        cert_file=_write_pem(directory / "server.pem", leaf.public_bytes(pem)),
        key_file=_write_pem(directory / "server-key.pem", key_pem),
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def arrivals(
    server: LoopbackServer, path: str, counted: Callable[[Exchange], bool] = lambda ex: True
) -> list[float]:
    """When each request to ``path`` that ``counted`` arrived (monotonic), from now on."""
    times: list[float] = []
    route = server.routes[path]

    def timed(ex: Exchange) -> None:
        if counted(ex):
            times.append(time.monotonic())
        route(ex)

    server.routes[path] = timed
    return times
