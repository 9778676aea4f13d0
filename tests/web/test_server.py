"""The web server against real clients: routes, negotiation, auth, TLS and starvation cases.

Each test starts a real server on 127.0.0.1:0 (RELIABILITY.md section 4.A).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import ipaddress
import logging
import os
import re
import selectors
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exporter.base.errors import ConfigError, ExporterError
from exporter.web.config import BasicAuthUsers
from exporter.web.server import HANDLER_THREADS, WebLimits, WebRoutes, WebServer

pytestmark = pytest.mark.integration

PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
FAST = WebLimits(tls_handshake_seconds=1.0, request_seconds=1.0, handler_seconds=2.0)


# --- a stand-in registry with one custom collector ------------------------------------------


class StandInCollector:
    """Renders fixed families; optionally slow, to watch handler concurrency."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def collect(self):
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            time.sleep(self.delay)
            phase = GaugeMetricFamily(
                "inference_server_phase",
                "Current phase, 1 for the current one.",
                labels=["target", "phase"],
            )
            phase.add_metric(["demo", "loading"], 1)
            phase.add_metric(["demo", "ready"], 0)
            yield phase
            reads = CounterMetricFamily(
                "inference_server_process_read_bytes",
                "Bytes read by the process tree.",
                labels=["target"],
            )
            reads.add_metric(["demo"], 1234.0)
            yield reads
        finally:
            with self._lock:
                self.running -= 1


def make_routes(collector: StandInCollector | None = None, **overrides: Any) -> WebRoutes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector or StandInCollector())
    routes = WebRoutes(
        registry=registry,
        status=lambda: b'{"targets": []}',
        page=lambda: b"<!doctype html><title>&lt;script&gt;</title>",
        ready=lambda: True,
    )
    return dataclasses.replace(routes, **overrides)


@contextlib.contextmanager
def serving(
    routes: WebRoutes | None = None, web_config: str | None = None, limits: WebLimits = FAST
) -> Iterator[WebServer]:
    server = WebServer(
        routes or make_routes(),
        listen_address="127.0.0.1:0",
        web_config_file=web_config,
        limits=limits,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def http_get(server: WebServer, path: str = "/metrics", **kwargs) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=5) as client:
        return client.get(f"http://127.0.0.1:{server.port}{path}", **kwargs)


# --- certificates made for the test -----------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    foreign_cert: Path
    foreign_key: Path
    rotated_cert: Path
    rotated_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    directory: Path,
    stem: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    sans: Sequence[x509.GeneralName],
) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(stem)
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    (directory / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (directory / f"{stem}.key").write_bytes(pem)
    return subject, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = _issue(d, "ca", None, [])
    loopback = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    _issue(d, "server", ca, loopback)
    _issue(d, "rotated", ca, loopback)
    _issue(d, "client", ca, [x509.DNSName("scraper.example")])
    foreign_ca = _issue(d, "foreign-ca", None, [])
    _issue(d, "foreign", foreign_ca, [x509.DNSName("scraper.example")])
    return Pki(
        ca=d / "ca.crt",
        server_cert=d / "server.crt",
        server_key=d / "server.key",
        client_cert=d / "client.crt",
        client_key=d / "client.key",
        foreign_cert=d / "foreign.crt",
        foreign_key=d / "foreign.key",
        rotated_cert=d / "rotated.crt",
        rotated_key=d / "rotated.key",
    )


def tls_config(tmp_path: Path, pki: Pki, extra: str = "") -> str:
    """A web config in its own directory with relative certificate paths (A14)."""
    shutil.copy(pki.server_cert, tmp_path / "server.crt")
    shutil.copy(pki.server_key, tmp_path / "server.key")
    shutil.copy(pki.ca, tmp_path / "ca.crt")
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n" + extra)
    return str(path)


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def https_get(server: WebServer, ctx: ssl.SSLContext, path: str = "/metrics") -> httpx.Response:
    with httpx.Client(verify=ctx, trust_env=False, timeout=5) as client:
        return client.get(f"https://127.0.0.1:{server.port}{path}")


def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``check`` until it holds: the server looks at its config files once a second."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the server did not pick up the changed files"
        time.sleep(0.05)


def refused(server: WebServer, ctx: ssl.SSLContext) -> bool:
    try:
        https_get(server, ctx)
    except httpx.ConnectError:
        return True
    return False


def presented_certificate(server: WebServer, pki: Pki) -> bytes:
    ctx = client_context(pki)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der_of(path: Path) -> bytes:
    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(
        serialization.Encoding.DER
    )


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# --- routes ------------------------------------------------------------------------------------


def test_routes_answer_with_their_content_types():
    with serving() as server:
        metrics = http_get(server, "/metrics")
        status = http_get(server, "/status")
        page = http_get(server, "/")
        healthy = http_get(server, "/-/healthy")
    assert metrics.status_code == 200
    assert 'inference_server_phase{phase="loading",target="demo"} 1.0' in metrics.text
    assert status.headers["content-type"] == "application/json"
    assert status.content == b'{"targets": []}'
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == "default-src 'self'"
    # The page is the daemon's; the server passes its escaping through untouched.
    assert b"&lt;script&gt;" in page.content
    assert b"<script>" not in page.content
    assert healthy.status_code == 200


def test_ready_follows_the_callback():
    ready = threading.Event()
    with serving(make_routes(ready=ready.is_set)) as server:
        assert http_get(server, "/-/ready").status_code == 503
        ready.set()
        assert http_get(server, "/-/ready").status_code == 200


@pytest.mark.parametrize("path", ["/metrics", "/status", "/", "/-/ready"])
def test_other_methods_get_405(path):
    with serving() as server, httpx.Client(trust_env=False) as client:
        url = f"http://127.0.0.1:{server.port}{path}"
        post = client.post(url, content=b"x" * 1000)
        delete = client.delete(url)
        head = client.head(url)
    assert (post.status_code, delete.status_code) == (405, 405)
    assert post.headers["allow"] == "GET, HEAD"
    assert head.status_code == 200
    assert head.content == b""


def test_unknown_path_is_404():
    with serving() as server:
        assert http_get(server, "/metrics/").status_code == 404
        assert http_get(server, "/../etc/passwd").status_code == 404


# --- /metrics negotiation (A22) ----------------------------------------------------------------


def test_keep_alive_responses_do_not_wait_for_delayed_acks():
    """Headers and body go out as two writes: without TCP_NODELAY each costs a 40 ms ACK wait."""
    with serving() as server, httpx.Client(trust_env=False) as client:
        times = []
        for _ in range(21):
            started = time.perf_counter()
            assert client.get(f"http://127.0.0.1:{server.port}/metrics").status_code == 200
            times.append(time.perf_counter() - started)
    assert sorted(times)[10] < 0.030


def test_prometheus_3_gets_openmetrics_ending_in_eof():
    with serving() as server:
        reply = http_get(server, headers={"Accept": PROMETHEUS_3_ACCEPT})
    assert reply.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert reply.text.endswith("# EOF\n")
    assert "inference_server_process_read_bytes_total" in reply.text


@pytest.mark.parametrize("accept", ["*/*", "", "text/plain"])
def test_other_scrapers_get_text_0_0_4(accept):
    with serving() as server:
        reply = http_get(server, headers={"Accept": accept})
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# EOF" not in reply.text


def test_gzip_only_when_accepted():
    with serving() as server, httpx.Client(trust_env=False) as client:
        url = f"http://127.0.0.1:{server.port}/metrics"
        zipped = client.get(url, headers={"Accept-Encoding": "gzip"})
        plain = client.get(url, headers={"Accept-Encoding": "identity"})
        refused = client.get(url, headers={"Accept-Encoding": "gzip;q=0"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert zipped.content == plain.content  # httpx decoded it
    assert "content-encoding" not in plain.headers
    assert "content-encoding" not in refused.headers


class CountingCollector(StandInCollector):
    """Counts how often the registry renders it."""

    calls = 0

    def collect(self):
        self.calls += 1
        yield from super().collect()


def test_metrics_are_rendered_once_per_snapshot_and_format():
    collector = CountingCollector()
    snapshot = [object()]
    routes = make_routes(collector, metrics_key=lambda: snapshot[0])
    with serving(routes) as server, httpx.Client(trust_env=False) as client:
        url = f"http://127.0.0.1:{server.port}/metrics"
        zipped = [client.get(url, headers={"Accept-Encoding": "gzip"}) for _ in range(5)]
        plain = [client.get(url, headers={"Accept-Encoding": "identity"}) for _ in range(5)]
        openmetrics = client.get(url, headers={"Accept": PROMETHEUS_3_ACCEPT})
        renders_of_one_snapshot = collector.calls
        snapshot[0] = object()  # the daemon published a new snapshot
        client.get(url, headers={"Accept-Encoding": "gzip"})
    assert renders_of_one_snapshot == 3  # gzip text, plain text, OpenMetrics: once each
    assert collector.calls == 4
    assert {r.content for r in zipped + plain} == {plain[0].content}  # httpx decoded gzip
    assert all(r.headers["content-encoding"] == "gzip" for r in zipped)
    assert openmetrics.text.endswith("# EOF\n")


def test_promtool_accepts_the_text_exposition(tmp_path):
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    assert os.path.exists(promtool), "promtool missing: apt-get install -y prometheus"
    with serving() as server:
        body = http_get(server, headers={"Accept": "*/*"}).content
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == b""


# --- web config: headers, auth, rate limit, reload (A3-A6, A16, A17) -----------------------------


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "web.yml"
    tmp = tmp_path / "web.yml.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)
    return str(path)


def users_config(password: bytes = b"right", extra: str = "") -> str:
    hashed = "$2y$" + bcrypt.hashpw(password, bcrypt.gensalt(4)).decode()[4:]
    return f"basic_auth_users:\n  prometheus: '{hashed}'\n" + extra


HEADERS = (
    "http_server_config:\n  headers:\n"
    "    X-Frame-Options: deny\n    Content-Security-Policy: \"default-src 'none'\"\n"
)


def test_configured_headers_are_on_every_response(tmp_path):
    with serving(web_config=write_config(tmp_path, HEADERS + users_config())) as server:
        replies = [
            http_get(server, "/", auth=("prometheus", "right")),
            http_get(server, "/nope", auth=("prometheus", "right")),
            http_get(server, "/metrics"),
        ]
    assert [r.status_code for r in replies] == [200, 404, 401]
    for reply in replies:
        assert reply.headers["x-frame-options"] == "deny"
        # The operator's policy replaces the page's default.
        assert reply.headers.get_list("content-security-policy") == ["default-src 'none'"]


def test_basic_auth(tmp_path):
    with serving(web_config=write_config(tmp_path, users_config())) as server:
        right = http_get(server, auth=("prometheus", "right"))
        again = http_get(server, auth=("prometheus", "right"))
        wrong = http_get(server, auth=("prometheus", "wrong"))
        unknown = http_get(server, auth=("mallory", "right"))
        too_long = http_get(server, auth=("prometheus", "right" + "x" * 100))
        missing = http_get(server)
    assert (right.status_code, again.status_code) == (200, 200)
    # A cached right password must not let the wrong one through (CVE-2022-46146).
    for reply in (wrong, unknown, too_long, missing):
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"] == "Basic"


def test_rate_limit_answers_429(tmp_path):
    config = write_config(tmp_path, "rate_limit:\n  interval: 1s\n  burst: 1\n")
    with serving(web_config=config) as server:
        assert http_get(server).status_code == 200
        assert http_get(server).status_code == 429


def test_config_corrupted_at_runtime_answers_500_then_recovers(tmp_path, caplog):
    path = write_config(tmp_path, users_config())
    with serving(web_config=path) as server:
        assert http_get(server, auth=("prometheus", "right")).status_code == 200
        caplog.set_level(logging.ERROR)
        write_config(tmp_path, "basic_auth_users:\n  prometheus: plaintext\n")
        until(lambda: http_get(server, auth=("prometheus", "right")).status_code == 500)
        assert http_get(server, "/-/healthy").status_code == 500
        assert len(caplog.records) == 1
        assert "basic_auth_users.prometheus" in caplog.records[0].getMessage()
        write_config(tmp_path, users_config(b"new"))
        until(lambda: http_get(server, auth=("prometheus", "new")).status_code == 200)
        assert http_get(server, auth=("prometheus", "right")).status_code == 401


def test_invalid_web_config_fails_at_construction(tmp_path):
    path = write_config(tmp_path, "tls_config:\n  cert_file: x\n")
    with pytest.raises(ConfigError, match="tls_config: unknown key"):
        WebServer(make_routes(), listen_address="127.0.0.1:0", web_config_file=path)


# --- handlers: cap, failure, hang --------------------------------------------------------------


def test_concurrent_scrapes_are_capped_at_the_handler_threads():
    collector = StandInCollector(delay=0.3)
    with serving(make_routes(collector)) as server:
        replies: list[int] = []
        threads = [
            threading.Thread(target=lambda: replies.append(http_get(server).status_code))
            for _ in range(10)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert replies == [200] * 10
    assert collector.most_running == HANDLER_THREADS


def test_failing_callback_is_500_and_logged_once(caplog):
    def broken() -> bytes:
        raise RuntimeError("snapshot missing")

    caplog.set_level(logging.ERROR, logger="exporter.web.server")
    with serving(make_routes(status=broken)) as server:
        assert http_get(server, "/status").status_code == 500
        assert http_get(server, "/status").status_code == 500
        assert http_get(server, "/metrics").status_code == 200
    assert [r.getMessage() for r in caplog.records] == [
        "web handler failed path=/status error=RuntimeError"
    ]


def test_hung_callback_times_out_and_health_still_answers():
    release = threading.Event()

    def hung() -> bytes:
        release.wait(10)
        return b"{}"

    limits = WebLimits(handler_seconds=0.5)
    try:
        with serving(make_routes(status=hung), limits=limits) as server:
            started = time.monotonic()
            replies = [http_get(server, "/status").status_code for _ in range(HANDLER_THREADS + 1)]
            assert replies == [503] * (HANDLER_THREADS + 1)
            assert time.monotonic() - started < 10
            assert http_get(server, "/-/healthy").status_code == 200
    finally:
        release.set()


# --- starvation (A18-A21) ----------------------------------------------------------------------


def test_idle_tls_client_does_not_delay_other_scrapes(tmp_path, pki):
    with serving(web_config=tls_config(tmp_path, pki)) as server:
        ctx = client_context(pki)
        with socket.create_connection(("127.0.0.1", server.port)) as idle:
            for _ in range(5):
                started = time.monotonic()
                assert https_get(server, ctx).status_code == 200
                assert time.monotonic() - started < 1.0
            # FAST has a 1 s handshake deadline; the idle socket is closed at it.
            assert closed_by_peer(idle, timeout=5)


def test_half_sent_requests_do_not_starve_scrapes_and_are_closed():
    with serving() as server:
        stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(520)]
        try:
            for s in stalled[:500]:  # the other 20 send nothing at all
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            for _ in range(5):
                started = time.monotonic()
                assert http_get(server).status_code == 200
                assert time.monotonic() - started < 1.0
            # FAST has a 1 s request deadline: every stalled socket is closed soon after.
            deadline = time.monotonic() + 10
            open_ = set(stalled)
            with selectors.DefaultSelector() as sel:
                for s in stalled:
                    sel.register(s, selectors.EVENT_READ)
                while open_ and time.monotonic() < deadline:
                    for key, _ in sel.select(timeout=0.5):
                        sel.unregister(key.fileobj)
                        open_.discard(key.fileobj)
            assert not open_, f"{len(open_)} stalled connections still open"
        finally:
            for s in stalled:
                s.close()


def test_slow_trickle_cannot_extend_the_request_deadline():
    with serving() as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        started = time.monotonic()
        s.settimeout(0.2)
        closed = False
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Trickle: aaaaaaaaaaaaaaaaaaaaaaa":
            try:
                s.sendall(bytes([byte]))
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                closed = True
                break
        assert closed
        assert time.monotonic() - started < 3.0


def _raw_exchange(server: WebServer, request: bytes) -> bytes:
    """Send raw bytes, read until the server closes or goes quiet for a second."""
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(1.0)
        s.sendall(request)
        reply = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                reply += chunk
    return reply


def test_a_request_head_past_16_kib_is_refused_and_closed():
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    with serving() as server:
        under = _raw_exchange(server, head + b"X-Big: " + b"a" * 12_000 + b"\r\n\r\n")
        over = _raw_exchange(server, head + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n")
        trickled = _raw_exchange(server, head + b"X-Big: " + b"a" * 200_000)  # never ends
        after = http_get(server)
    assert under.startswith(b"HTTP/1.1 200 ")
    assert over.startswith(b"HTTP/1.1 400 ") and b"connection: close" in over.lower()
    assert trickled.startswith(b"HTTP/1.1 400 ")
    assert after.status_code == 200


def test_pipelined_requests_are_each_answered_in_order():
    request = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
    with serving() as server:
        reply = _raw_exchange(server, request * 3)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", reply) == [b"200", b"404"] * 3


def test_connections_beyond_the_cap_are_closed_at_accept(caplog):
    """With every connection mid-request (none idle to make way), a newcomer is closed."""
    caplog.set_level(logging.WARNING, logger="exporter.web.server")
    limits = dataclasses.replace(FAST, max_connections=20, request_seconds=30)
    with serving(limits=limits) as server, contextlib.ExitStack() as stack:
        held = [
            stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
            for _ in range(20)
        ]
        for s in held:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # a request under way, never finished
        until(lambda: not server._guard.idle._idle)  # the server read each one's first bytes
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            assert closed_by_peer(extra, timeout=5)
        assert [r.getMessage() for r in caplog.records] == [
            "connection limit reached, closing new connections limit=20"
        ]
        for s in held[:5]:
            s.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if http_get(server, "/-/healthy").status_code == 200:
                    break
        else:
            raise AssertionError("not served again after connections were released")


def _listen_overflows() -> int:
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")


def test_a_hundred_simultaneous_connects_are_all_accepted():
    request = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with serving() as server:
        before = _listen_overflows()
        socks = [socket.socket() for _ in range(100)]
        try:
            for s in socks:
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", server.port))
            for s in socks:
                s.setblocking(True)
                s.settimeout(5)
                s.sendall(request)
            answers = [s.recv(64) for s in socks]
        finally:
            for s in socks:
                s.close()
        after = _listen_overflows()
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert after == before, "the listen queue overflowed: backlog too small"


def test_plain_http_to_the_tls_port_is_dropped_and_serving_goes_on(tmp_path, pki):
    with serving(web_config=tls_config(tmp_path, pki)) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_by_peer(s, timeout=5)
        assert https_get(server, client_context(pki)).status_code == 200


# --- TLS settings (A8, A10, A11, A14, A15) -----------------------------------------------------


def test_relative_certificate_paths_work_from_another_directory(tmp_path, pki, monkeypatch):
    config = tls_config(tmp_path, pki)
    monkeypatch.chdir("/")
    with serving(web_config=config) as server:
        assert https_get(server, client_context(pki)).status_code == 200


MTLS = "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"


def test_require_and_verify_client_cert(tmp_path, pki):
    with serving(web_config=tls_config(tmp_path, pki, MTLS)) as server:
        good = client_context(pki, pki.client_cert, pki.client_key)
        for refused in (
            client_context(pki),
            client_context(pki, pki.foreign_cert, pki.foreign_key),
        ):
            with pytest.raises((httpx.TransportError, ssl.SSLError)):
                https_get(server, refused)
            # Other clients are still served.
            assert https_get(server, good).status_code == 200


def test_inline_client_ca(tmp_path, pki):
    pem = "".join(f"    {line}\n" for line in pki.ca.read_text().splitlines())
    extra = f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca: |\n{pem}"
    with serving(web_config=tls_config(tmp_path, pki, extra)) as server:
        good = client_context(pki, pki.client_cert, pki.client_key)
        assert https_get(server, good).status_code == 200
        with pytest.raises((httpx.TransportError, ssl.SSLError)):
            https_get(server, client_context(pki, pki.foreign_cert, pki.foreign_key))


def test_verify_client_cert_if_given(tmp_path, pki):
    extra = "  client_ca_file: ca.crt\n  client_auth_type: VerifyClientCertIfGiven\n"
    with serving(web_config=tls_config(tmp_path, pki, extra)) as server:
        assert https_get(server, client_context(pki)).status_code == 200
        with pytest.raises((httpx.TransportError, ssl.SSLError)):
            https_get(server, client_context(pki, pki.foreign_cert, pki.foreign_key))


@pytest.mark.parametrize(
    ("sans", "admitted"), [("[scraper.example]", True), ("[other.example]", False)]
)
def test_client_allowed_sans(tmp_path, pki, sans, admitted):
    config = tls_config(tmp_path, pki, MTLS + f"  client_allowed_sans: {sans}\n")
    with serving(web_config=config) as server:
        ctx = client_context(pki, pki.client_cert, pki.client_key)
        if admitted:
            assert https_get(server, ctx).status_code == 200
        else:
            with pytest.raises(httpx.TransportError):
                https_get(server, ctx)


def test_tls13_only_refuses_a_tls12_client(tmp_path, pki):
    with serving(web_config=tls_config(tmp_path, pki, "  min_version: TLS13\n")) as server:
        old = client_context(pki)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(httpx.ConnectError):
            https_get(server, old)
        assert https_get(server, client_context(pki)).status_code == 200


def test_configured_cipher_and_curve_are_negotiated(tmp_path, pki):
    extra = (
        "  max_version: TLS12\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n"
        "  curve_preferences: [CurveP384]\n"
    )
    with serving(web_config=tls_config(tmp_path, pki, extra)) as server:
        ctx = client_context(pki)
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.version() == "TLSv1.2"
            cipher = tls.cipher()
        assert cipher is not None
        assert cipher[0] == "ECDHE-ECDSA-AES256-GCM-SHA384"


def test_rotated_certificate_is_presented_on_the_next_connection(tmp_path, pki):
    with serving(web_config=tls_config(tmp_path, pki)) as server:
        assert presented_certificate(server, pki) == der_of(pki.server_cert)
        # As certbot and cert-manager do: write new files, then rename over the old ones.
        for source, target in ((pki.rotated_key, "server.key"), (pki.rotated_cert, "server.crt")):
            shutil.copy(source, tmp_path / f"{target}.new")
            os.replace(tmp_path / f"{target}.new", tmp_path / target)
        until(lambda: presented_certificate(server, pki) == der_of(pki.rotated_cert))


def test_tls_settings_changed_at_runtime_apply_to_the_next_connection(tmp_path, pki):
    config = tls_config(tmp_path, pki)
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with serving(web_config=config) as server:
        assert https_get(server, old).status_code == 200
        text = Path(config).read_text() + "  min_version: TLS13\n"
        write_config(tmp_path, text)
        until(lambda: refused(server, old))
        assert https_get(server, client_context(pki)).status_code == 200


def test_half_rotated_certificate_keeps_the_old_one(tmp_path, pki, caplog):
    with serving(web_config=tls_config(tmp_path, pki)) as server:
        caplog.set_level(logging.ERROR, logger="exporter.web.config")
        shutil.copy(pki.rotated_cert, tmp_path / "server.crt")  # the key is not there yet
        until(
            lambda: (
                presented_certificate(server, pki) == der_of(pki.server_cert)
                and len(caplog.records) == 1
            )
        )
        assert presented_certificate(server, pki) == der_of(pki.server_cert)
        assert len(caplog.records) == 1  # logged once, not per connection
        shutil.copy(pki.rotated_key, tmp_path / "server.key")
        until(lambda: presented_certificate(server, pki) == der_of(pki.rotated_cert))


def test_missing_certificate_fails_at_construction(tmp_path, pki):
    config = tls_config(tmp_path, pki)
    (tmp_path / "server.key").unlink()
    with pytest.raises(ConfigError, match=r"tls_server_config.cert_file: cannot load .*server.crt"):
        WebServer(make_routes(), listen_address="127.0.0.1:0", web_config_file=config)


# --- binding -----------------------------------------------------------------------------------


def test_bind_failure_names_the_flag():
    with serving() as server:
        taken = f"127.0.0.1:{server.port}"
        with pytest.raises(ExporterError) as info:
            WebServer(make_routes(), listen_address=taken).start()
    assert (
        str(info.value)
        == f"cannot listen on {taken} (--web.listen-address): address already in use"
    )


def test_port_zero_on_all_interfaces():
    server = WebServer(make_routes(), listen_address=":0")
    server.start()
    try:
        assert server.port > 0
        assert http_get(server, "/-/healthy").status_code == 200
        if socket.has_dualstack_ipv6():
            with httpx.Client(trust_env=False) as client:
                assert client.get(f"http://[::1]:{server.port}/-/healthy").status_code == 200
    finally:
        server.stop()


def test_malformed_address_names_the_flag():
    with pytest.raises(ExporterError, match=r"cannot listen on 10049 \(--web.listen-address\)"):
        WebServer(make_routes(), listen_address="10049").start()


def test_stop_with_clients_mid_handshake_and_mid_request_leaks_nothing(tmp_path, pki):
    slow = WebLimits(tls_handshake_seconds=30, request_seconds=30)
    with contextlib.ExitStack() as clients:
        started = time.monotonic()
        with serving(web_config=tls_config(tmp_path, pki), limits=slow) as tls_server:
            clients.enter_context(socket.create_connection(("127.0.0.1", tls_server.port)))
            assert https_get(tls_server, client_context(pki)).status_code == 200
        with serving(limits=slow) as server:
            half = clients.enter_context(socket.create_connection(("127.0.0.1", server.port)))
            half.sendall(b"GET /metrics HTTP/1.1\r\n")
            assert http_get(server, "/-/healthy").status_code == 200
        assert time.monotonic() - started < 5
    gc.collect()  # an unclosed transport would now raise a ResourceWarning (an error here)


def test_stop_releases_the_port():
    with serving() as server:
        port = server.port
    again = WebServer(make_routes(), listen_address=f"127.0.0.1:{port}")
    again.start()
    try:
        assert http_get(again, "/-/healthy").status_code == 200
    finally:
        again.stop()
        again.stop()


def two_users_config() -> str:
    cheap = "$2y$" + bcrypt.hashpw(b"cheap", bcrypt.gensalt(4)).decode()[4:]
    dear = "$2y$" + bcrypt.hashpw(b"dear", bcrypt.gensalt(12)).decode()[4:]
    return f"basic_auth_users:\n  cheap: '{cheap}'\n  dear: '{dear}'\n"


def timed_get(server: WebServer, **kwargs) -> tuple[int, float]:
    started = time.perf_counter()
    reply = http_get(server, **kwargs)
    return reply.status_code, time.perf_counter() - started


def test_timing_does_not_tell_which_users_exist(tmp_path):
    # One user's hash costs 4 rounds, another's 12: the cheap user, a wrong password for it
    # and an unknown user all answer no sooner than one check at cost 12.
    slowest = BasicAuthUsers({"x": "$2b$12$" + "a" * 53}).slowest_check_seconds
    with serving(web_config=write_config(tmp_path, two_users_config())) as server:
        known = timed_get(server, auth=("cheap", "wrong"))
        unknown = timed_get(server, auth=("mallory", "wrong"))
        right = timed_get(server, auth=("cheap", "cheap"))
    assert (known[0], unknown[0], right[0]) == (401, 401, 200)
    for _, seconds in (known, unknown, right):
        assert seconds >= 0.25 * slowest  # padded to the slowest check (a cost-4 check: ~1 ms)


def test_probe_paths_answer_without_credentials_and_the_rest_does_not(tmp_path):
    # The shipped DaemonSet's liveness and readiness probes carry no credentials.
    with serving(web_config=write_config(tmp_path, users_config())) as server:
        assert http_get(server, "/-/healthy").status_code == 200
        assert http_get(server, "/-/ready").status_code in (200, 503)
        assert http_get(server, "/status").status_code == 401
        assert http_get(server, "/metrics").status_code == 401


def test_a_check_queued_too_long_is_busy_not_unauthorized(tmp_path):
    limits = dataclasses.replace(FAST, handler_seconds=0.05)
    config = write_config(tmp_path, two_users_config())
    # eight cost-12 checks queue behind the one bcrypt worker
    with serving(web_config=config, limits=limits) as server, ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: http_get(server, auth=("dear", "no")), range(8)))
    statuses = {r.status_code for r in codes}
    assert 503 in statuses and statuses <= {401, 503}
    busy = next(r for r in codes if r.status_code == 503)
    assert busy.headers["retry-after"] == "1"


@pytest.mark.integration
def test_idle_connections_beyond_the_cap_do_not_lock_out_a_scrape():
    # More silent connections than the cap: the longest idle is closed for each newcomer.
    limits = dataclasses.replace(FAST, max_connections=64, request_seconds=30.0)
    with serving(limits=limits) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(100)]
        try:
            time.sleep(0.2)
            replies = [http_get(server) for _ in range(5)]
        finally:
            for sock in idle:
                sock.close()
    assert [r.status_code for r in replies] == [200] * 5


def test_the_connection_cap_stays_under_a_low_open_files_limit():
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400));"
        "from exporter.web.transport import _connection_cap; print(_connection_cap(1024))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert int(done.stdout) == 400 - 256  # descriptors kept for the sources
