"""Probes against real loopback servers: every outcome, the total deadline, caps and secrecy."""

from __future__ import annotations

import gzip
import json
import logging
import resource
import time
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from exporter.base.errors import ConfigError
from exporter.base.model import ProbeKind, ProbeOutcome, ProbeResult
from exporter.config import CompletionProbe, Target
from exporter.config.keys import load_api_key
from exporter.sources.probe import Prober
from exporter.sources.probe.answers import has_choices, says_loading
from tests.httpservers import (
    Exchange,
    LoopbackServer,
    closed_port,
    endless,
    gzip_bomb,
    gzip_zeros,
    hang,
    make_tls_files,
    redirect,
    reply,
    trickle,
)

CANARY = "sk-CANARY-7f3a9c"
CAP = 65536
LLAMA_LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
CHOICES = {"choices": [{"text": " 4", "index": 0, "finish_reason": "length"}]}


def make_target(base_url: str, *, timeout: float = 1.0, **extra) -> Target:
    extra.setdefault("completion", CompletionProbe(model="m", prompt="2+2=", max_tokens=4))
    return Target(
        name="t",
        engine="llamacpp",
        base_url=base_url,
        health_path="/health",
        probe_timeout_seconds=timeout,
        **extra,
    )


@pytest.fixture
def server():
    with LoopbackServer() as srv:
        yield srv


@pytest.fixture
def prober_for():
    made: list[Prober] = []

    def make(target: Target, **kwargs) -> Prober:
        made.append(Prober(target, **kwargs))
        return made[-1]

    yield make
    for prober in made:
        prober.close()


def key_file(tmp_path: Path, mode: int) -> str:
    path = tmp_path / "key"
    path.write_text(CANARY + "\n")
    path.chmod(mode)
    return str(path)


def summary(result: ProbeResult) -> tuple[ProbeOutcome, int | None, bool, bool]:
    return (result.outcome, result.status_code, result.loading, result.has_choices)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def health_with_peak_memory(prober: Prober) -> tuple[ProbeResult, int]:
    """One health probe and the peak of Python allocations during it (all threads)."""
    tracemalloc.start()
    try:
        result = prober.probe_health()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- one reply, one outcome ---------------------------------------------------------------

OK, HTTP, BAD = ProbeOutcome.OK, ProbeOutcome.HTTP_STATUS, ProbeOutcome.BAD_BODY
GZIPPED_CHOICES = gzip.compress(json.dumps(CHOICES).encode())
REPLIES = {  # id: (path, route, (outcome, status, loading, has_choices))
    "health-vllm-empty-200": ("/health", reply(200, b""), (OK, 200, False, False)),
    "health-llamacpp-ok": ("/health", reply(200, {"status": "ok"}), (OK, 200, False, False)),
    "health-tgi-text-200": ("/health", reply(200, "OK"), (OK, 200, False, False)),
    "health-llamacpp-loading": ("/health", reply(503, LLAMA_LOADING), (HTTP, 503, True, False)),
    "health-llamacpp-2024-loading": (
        "/health", reply(503, {"status": "loading model"}), (HTTP, 503, True, False),
    ),
    "health-tgi-unhealthy": (
        "/health", reply(503, {"error": "unhealthy", "error_type": "healthcheck"}),
        (HTTP, 503, False, False),
    ),
    "health-garbage-503": ("/health", reply(503, b"{garbage"), (HTTP, 503, False, False)),
    "completion-loading": (
        "/v1/completions", reply(503, LLAMA_LOADING), (HTTP, 503, True, False),
    ),
    "completion-empty-choices": (
        "/v1/completions", reply(200, {"choices": []}), (BAD, 200, False, False),
    ),
    "completion-no-choices": (
        "/v1/completions", reply(200, {"object": "text_completion"}), (BAD, 200, False, False),
    ),
    "completion-garbage-json": ("/v1/completions", reply(200, b"{garb"), (BAD, 200, False, False)),
    "completion-json-list": ("/v1/completions", reply(200, [1, 2]), (BAD, 200, False, False)),
    "completion-gzip-decoded": (
        "/v1/completions", reply(200, GZIPPED_CHOICES, headers={"Content-Encoding": "gzip"}),
        (OK, 200, False, True),
    ),
    "completion-unrequested-encoding": (
        "/v1/completions", reply(200, b"\x00\x01", headers={"Content-Encoding": "br"}),
        (BAD, 200, False, False),
    ),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize(("path", "route", "expected"), REPLIES.values(), ids=REPLIES.keys())
def test_one_reply_one_outcome(server, prober_for, path, route, expected):
    server.routes[path] = route
    prober = prober_for(make_target(server.url))
    result = prober.probe_health() if path == "/health" else prober.probe_completion()
    assert summary(result) == expected
    assert 0 < result.duration_seconds < 1.0
    assert abs(result.at - time.time()) < 5


# --- absent and broken endpoints -------------------------------------------------------------


@pytest.mark.integration
def test_closed_port_is_refused(prober_for):
    result = prober_for(make_target(f"http://127.0.0.1:{closed_port()}")).probe_health()
    assert summary(result) == (ProbeOutcome.REFUSED, None, False, False)


@pytest.mark.integration
def test_server_closing_without_reply_is_error(server, prober_for):
    def say_nothing(ex: Exchange) -> None:
        ex.close_connection = True

    server.routes["/health"] = say_nothing
    result = prober_for(make_target(server.url)).probe_health()
    assert result.outcome is ProbeOutcome.ERROR


# --- the total deadline -----------------------------------------------------------------------


@pytest.mark.integration
def test_hanging_server_times_out_at_the_deadline(server, prober_for):
    server.routes["/health"] = hang()
    started = time.monotonic()
    result = prober_for(make_target(server.url, timeout=0.5)).probe_health()
    wall = time.monotonic() - started
    assert result.outcome is ProbeOutcome.TIMEOUT
    assert 0.5 <= wall < 1.0  # generous upper bound: the deadline holds


@pytest.mark.integration
@pytest.mark.parametrize("head_too", [False, True], ids=["body-trickles", "headers-trickle"])
def test_trickling_server_is_cut_at_the_total_deadline(server, prober_for, head_too):
    # Each byte arrives well inside httpx's per-read timeout, so only a total deadline ends it
    # (encode/httpx#1450: 1 s timeout, 5.7 s wall).
    server.routes["/health"] = trickle(0.3, head_too=head_too)
    started = time.monotonic()
    result = prober_for(make_target(server.url, timeout=1.0)).probe_health()
    wall = time.monotonic() - started
    assert result.outcome is ProbeOutcome.TIMEOUT
    assert wall < 1.5
    assert result.duration_seconds < 1.5


# --- byte caps ------------------------------------------------------------------------------


@pytest.mark.integration
def test_1gb_body_stops_at_the_cap_with_flat_memory(server, prober_for):
    server.routes["/health"] = endless(1 << 30)
    prober = prober_for(make_target(server.url, timeout=5.0), max_body_bytes=CAP)
    rss_before = peak_rss_bytes()
    result, peak = health_with_peak_memory(prober)
    assert (result.outcome, result.status_code) == (ProbeOutcome.BODY_TOO_LARGE, 200)
    assert peak < 2 << 20
    assert peak_rss_bytes() - rss_before < 8 << 20
    server.close()  # settles bytes_sent: the route ends when the prober hangs up
    assert server.bytes_sent < 64 << 20  # far from 1 GB: reading stopped at the cap


@pytest.mark.integration
def test_gzip_bomb_is_capped_after_decompression(server, prober_for):
    assert len(gzip_zeros(32 << 20)) < CAP  # only decoding reveals that the body is too large
    server.routes["/health"] = gzip_bomb(32 << 20)
    prober = prober_for(make_target(server.url), max_body_bytes=CAP)
    result, peak = health_with_peak_memory(prober)
    assert result.outcome is ProbeOutcome.BODY_TOO_LARGE
    assert peak < 2 << 20  # never inflates a whole chunk: 32 MB would show here


# --- redirects, proxies, TLS, auth --------------------------------------------------------------


@pytest.mark.integration
def test_redirect_to_another_host_is_not_followed(server, prober_for, tmp_path):
    with LoopbackServer({"/health": reply(200, {"status": "ok"})}) as elsewhere:
        server.routes["/health"] = redirect(f"http://localhost:{elsewhere.port}/health")
        target = make_target(server.url, api_key_file=key_file(tmp_path, 0o600))
        result = prober_for(target).probe_health()
        assert (result.outcome, result.status_code) == (ProbeOutcome.REDIRECT, 302)
        assert elsewhere.connections == 0


@pytest.mark.integration
def test_http_proxy_from_the_environment_is_ignored(server, prober_for, monkeypatch):
    server.routes["/health"] = reply(200, {"status": "ok"})
    with LoopbackServer() as proxy:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("PROBE_KEY", CANARY)
        result = prober_for(make_target(server.url, api_key_env="PROBE_KEY")).probe_health()
        assert result.outcome is ProbeOutcome.OK
        assert server.requests[-1].headers["authorization"] == f"Bearer {CANARY}"
        assert proxy.connections == 0
        # Control: a client that honours the environment does reach this proxy listener.
        try:
            # a fresh opener: urlopen() caches one, with whatever proxies were set back then
            urllib.request.build_opener().open(server.url + "/health", timeout=5).close()
        except urllib.error.HTTPError as exc:
            exc.close()
        assert proxy.connections == 1
        assert proxy.requests[0].path == server.url + "/health"


@pytest.mark.integration
def test_self_signed_tls_needs_the_ca_file(prober_for, tmp_path):
    tls = make_tls_files(tmp_path)
    with LoopbackServer({"/health": reply(200, {"status": "ok"})}, tls=tls) as srv:
        without = prober_for(make_target(srv.url)).probe_health()
        with_ca = prober_for(make_target(srv.url), ca_file=tls.ca_file).probe_health()
        assert (without.outcome, without.status_code) == (ProbeOutcome.TLS, None)
        assert (with_ca.outcome, with_ca.status_code) == (ProbeOutcome.OK, 200)
        assert len(srv.requests) == 1  # the refused handshake sent no request


@pytest.mark.integration
@pytest.mark.parametrize("status", [401, 403])
def test_rejected_key_is_unauthorized_after_one_request(server, prober_for, tmp_path, status):
    server.routes["/health"] = reply(status, {"error": "invalid api key"})
    target = make_target(server.url, api_key_file=key_file(tmp_path, 0o600))
    result = prober_for(target).probe_health()
    assert (result.outcome, result.status_code) == (ProbeOutcome.UNAUTHORIZED, status)
    assert len(server.requests) == 1  # no retry storm
    assert server.requests[0].headers["authorization"] == f"Bearer {CANARY}"


@pytest.mark.integration
def test_key_and_bodies_never_reach_the_logs(server, prober_for, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    server.routes["/health"] = reply(401, {"echo": CANARY})
    server.routes["/v1/completions"] = reply(500, f"{CANARY} prompt=2+2=")
    prober = prober_for(make_target(server.url, api_key_file=key_file(tmp_path, 0o600)))
    results = [prober.probe_health(), prober.probe_completion()]
    server.routes["/health"] = lambda ex: setattr(ex, "close_connection", True)
    results.append(prober.probe_health())
    assert [r.outcome for r in results] == [
        ProbeOutcome.UNAUTHORIZED,
        ProbeOutcome.HTTP_STATUS,
        ProbeOutcome.ERROR,
    ]
    assert "probe outcome changed" in caplog.text  # edges are logged ...
    assert CANARY not in caplog.text and "2+2=" not in caplog.text  # ... secrets are not


# --- completion ------------------------------------------------------------------------------


@pytest.mark.integration
def test_completion_with_choices_is_ok(server, prober_for):
    server.routes["/v1/completions"] = reply(200, CHOICES)
    result = prober_for(make_target(server.url)).probe_completion()
    assert result.kind is ProbeKind.COMPLETION
    assert summary(result) == (ProbeOutcome.OK, 200, False, True)
    sent = server.requests[0]
    assert (sent.method, sent.path, sent.headers["content-type"]) == (
        "POST",
        "/v1/completions",
        "application/json",
    )
    assert json.loads(sent.body) == {
        "model": "m",
        "prompt": "2+2=",
        "max_tokens": 4,
        "temperature": 0,
    }


def test_completion_without_a_configured_probe_is_error_not_exception(prober_for):
    prober = prober_for(make_target("http://127.0.0.1:9", completion=None))
    assert prober.probe_completion().outcome is ProbeOutcome.ERROR


# --- API key loading and body parsing (no server) -------------------------------------------------


def test_world_readable_key_file_is_refused_by_name(tmp_path):
    path = key_file(tmp_path, 0o644)
    with pytest.raises(ConfigError) as err:
        load_api_key(make_target("http://127.0.0.1:1", api_key_file=path))
    assert (
        str(err.value) == f"{path}: api_key_file: is readable by other users (mode 0644); chmod 600"
    )
    assert CANARY not in str(err.value)


def test_key_from_private_file_or_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_KEY", f" {CANARY}\n")
    from_file = make_target("http://h", api_key_file=key_file(tmp_path, 0o640))
    assert load_api_key(from_file) == CANARY
    assert load_api_key(make_target("http://h", api_key_env="PROBE_KEY")) == CANARY
    assert load_api_key(make_target("http://h")) is None


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing-file", "{tmp}/absent: api_key_file: cannot read: No such file or directory"),
        ("unset-env", "$PROBE_KEY: api_key_env: is empty or not set"),
        (
            "two-lines",
            "{tmp}/key: api_key_file: must hold one line of printable ASCII without spaces",
        ),
    ],
)
def test_unusable_key_is_one_line_naming_where(tmp_path, monkeypatch, setup, message):
    monkeypatch.delenv("PROBE_KEY", raising=False)
    if setup == "missing-file":
        target = make_target("http://h", api_key_file=str(tmp_path / "absent"))
    elif setup == "unset-env":
        target = make_target("http://h", api_key_env="PROBE_KEY")
    else:
        (tmp_path / "key").write_text(f"{CANARY}\n{CANARY}\n")
        (tmp_path / "key").chmod(0o600)
        target = make_target("http://h", api_key_file=str(tmp_path / "key"))
    with pytest.raises(ConfigError) as err:
        Prober(target)
    assert str(err.value) == message.format(tmp=tmp_path)
    assert CANARY not in str(err.value)


def test_unreadable_ca_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"absent.pem: ca_file: cannot load"):
        Prober(make_target("https://h"), ca_file=str(tmp_path / "absent.pem"))


@pytest.mark.parametrize(
    ("status", "body", "loading"),
    [
        (503, json.dumps(LLAMA_LOADING).encode(), True),
        (503, b'{"status": "loading model"}', True),
        (200, json.dumps(LLAMA_LOADING).encode(), False),
        (503, b"", False),
        (503, b"\xff\xfe not json", False),
    ],
)
def test_says_loading(status, body, loading):
    assert says_loading(status, body) is loading


def test_has_choices_needs_a_non_empty_list():
    assert has_choices(json.dumps(CHOICES).encode())
    assert not has_choices(b'{"choices": {"text": "4"}}')
    assert not has_choices(b"null")


# --- vLLM sleep mode ------------------------------------------------------------------------


def vllm_target(base_url: str) -> Target:
    return Target("t", "vllm", base_url, "/health", 1.0)


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"is_sleeping": True}, True), ({"is_sleeping": False}, False), ({"other": 1}, None)],
)
def test_a_ready_vllm_is_asked_whether_it_sleeps(server, prober_for, body, expected):
    server.routes["/health"] = reply(200, b"")
    server.routes["/is_sleeping"] = reply(200, body)
    result = prober_for(vllm_target(server.url)).sample()
    assert result.ok and result.sleeping is expected
    assert [r.path for r in server.requests] == ["/health", "/is_sleeping"]


def test_sleep_state_is_not_asked_of_a_server_that_is_not_up(server, prober_for):
    server.routes["/health"] = reply(503, b"")
    server.routes["/is_sleeping"] = reply(200, {"is_sleeping": True})
    result = prober_for(vllm_target(server.url)).sample()
    assert result.sleeping is None and [r.path for r in server.requests] == ["/health"]


def test_a_vllm_without_dev_mode_is_asked_once_then_left_alone(server, prober_for, caplog):
    server.routes["/health"] = reply(200, b"")  # /is_sleeping: 404, as without dev mode
    prober = prober_for(vllm_target(server.url))
    with caplog.at_level(logging.INFO, logger="exporter.sources.probe"):
        results = [prober.sample() for _ in range(3)]
    assert all(r.ok and r.sleeping is None for r in results)
    assert [r.path for r in server.requests].count("/is_sleeping") == 1
    assert "VLLM_SERVER_DEV_MODE" in caplog.text


def test_engines_without_a_sleep_mode_are_never_asked(server, prober_for):
    server.routes["/health"] = reply(200, b"{}")
    prober_for(make_target(server.url)).sample()
    assert [r.path for r in server.requests] == ["/health"]


# --- kept connections (HTTP/1.1 keep-alive) ---------------------------------------------------


@pytest.fixture
def kept():
    with LoopbackServer({"/health": reply(200, {"status": "ok"})}, keep_alive=True) as srv:
        yield srv


def say_nothing(ex: Exchange) -> None:
    """Read the request, close without a reply: a server dropping an idle connection as it
    was reused looks exactly like this to the client."""
    ex.close_connection = True


def outcomes(results: list[ProbeResult]) -> list[ProbeOutcome]:
    return [r.outcome for r in results]


@pytest.mark.integration
def test_health_probes_reuse_one_connection(kept, prober_for):
    prober = prober_for(make_target(kept.url))
    results = [prober.probe_health() for _ in range(20)]
    assert outcomes(results) == [OK] * 20
    assert (kept.connections, len(kept.requests)) == (1, 20)
    # The server writes head and body apart with Nagle on: no 40 ms delayed-ACK stall each.
    assert sorted(r.duration_seconds for r in results)[10] < 0.02


@pytest.mark.integration
def test_tls_connection_is_reused_too(prober_for, tmp_path):
    tls = make_tls_files(tmp_path)
    with LoopbackServer({"/health": reply(200, b"")}, tls=tls, keep_alive=True) as srv:
        prober = prober_for(make_target(srv.url), ca_file=tls.ca_file)
        assert outcomes([prober.probe_health() for _ in range(5)]) == [OK] * 5
        assert srv.connections == 1


@pytest.mark.integration
@pytest.mark.parametrize("server_kind", ["http/1.0", "connection-close"])
def test_a_server_that_closes_after_each_reply_gets_a_fresh_connection_each(
    prober_for, server_kind
):
    http11 = server_kind == "connection-close"
    route = reply(200, b"{}", headers={"Connection": "close"} if http11 else None)
    with LoopbackServer({"/health": route}, keep_alive=http11) as srv:
        prober = prober_for(make_target(srv.url))
        assert outcomes([prober.probe_health() for _ in range(5)]) == [OK] * 5
        assert (srv.connections, len(srv.requests)) == (5, 5)


@pytest.mark.integration
@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_server_closing_idle_connections_never_fails_a_probe(prober_for, tmp_path, tls):
    files = make_tls_files(tmp_path) if tls else None
    routes = {"/health": reply(200, b"")}
    with LoopbackServer(routes, tls=files, keep_alive=True, idle_timeout=0.05) as srv:
        prober = prober_for(make_target(srv.url), ca_file=files.ca_file if files else None)
        results = []
        for _ in range(4):
            results.append(prober.probe_health())
            time.sleep(0.2)  # the server closes the kept connection meanwhile
        assert outcomes(results) == [OK] * 4
        assert (srv.connections, len(srv.requests)) == (4, 4)


@pytest.mark.integration
@pytest.mark.parametrize("when", ["with-the-reply", "while-idle"])
def test_bytes_past_the_reply_are_never_read_as_the_next_reply(kept, prober_for, when):
    junk = b"HTTP/1.1 500 Not Asked For\r\nContent-Length: 0\r\n\r\n"

    def reply_then_junk(ex: Exchange) -> None:
        ex.send_head(200, {"Content-Length": "2"})
        if when == "with-the-reply":  # read with the body: parsed with the reply
            ex.write(b"{}" + junk)
        else:  # arrives after the exchange ended: only a look before reuse sees it
            ex.write(b"{}")
            ex.stopping.wait(0.03)
            ex.write(junk)

    kept.routes["/health"] = reply_then_junk
    prober = prober_for(make_target(kept.url))
    results = []
    for _ in range(3):
        results.append(prober.probe_health())
        time.sleep(0.2)  # the junk is in before the next probe, even on a busy machine
    assert [(r.outcome, r.status_code) for r in results] == [(OK, 200)] * 3
    assert kept.connections == 3  # each tainted connection was dropped, never reused


def raw(data: bytes, *, close: bool = False):
    """A route that writes ``data`` as the whole reply, head included."""

    def route(ex: Exchange) -> None:
        ex.write(data)
        ex.close_connection = close

    return route


ERR = ProbeOutcome.ERROR
RAW = {  # id: (reply bytes, the server closes after, outcome); h11 gave the same outcomes
    "interim-100-skipped": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        False, OK,
    ),
    "bare-lf-line-ends": (b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", False, OK),
    "body-ends-at-close": (b"HTTP/1.1 503 Busy\r\n\r\n" + b"x" * 3000, True, HTTP),
    "length-cut-short": (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}", True, ERR),
    "not-http": (b"SSH-2.0-OpenSSH_9.6\r\n", True, ERR),
    "switching-protocols": (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
        False, ERR,
    ),
    "head-past-100-kib": (
        b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * (200 << 10) + b"\r\n\r\n",
        True, ERR,
    ),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize(("data", "close", "outcome"), RAW.values(), ids=RAW.keys())
def test_raw_replies_are_judged_as_http_1_1_reads_them(kept, prober_for, data, close, outcome):
    kept.routes["/health"] = raw(data, close=close)
    prober = prober_for(make_target(kept.url))
    assert prober.probe_health().outcome is outcome


@pytest.mark.integration
def test_a_kept_connection_closed_as_it_is_reused_gets_one_fresh_try(kept, prober_for):
    def close_if_reused(ex: Exchange) -> None:
        if ex.requests_on_connection > 1:
            say_nothing(ex)
        else:
            reply(200, b"")(ex)

    kept.routes["/health"] = close_if_reused
    prober = prober_for(make_target(kept.url))
    assert outcomes([prober.probe_health() for _ in range(3)]) == [OK] * 3
    # probes 2 and 3 each: the request on the kept connection, then one on a fresh one
    assert (kept.connections, len(kept.requests)) == (3, 5)


@pytest.mark.integration
def test_the_fresh_try_is_the_only_retry(kept, prober_for):
    prober = prober_for(make_target(kept.url))
    assert prober.probe_health().ok
    kept.routes["/health"] = say_nothing
    assert prober.probe_health().outcome is ProbeOutcome.ERROR
    assert (kept.connections, len(kept.requests)) == (2, 3)  # kept, then one fresh: no more


@pytest.mark.integration
def test_no_retry_once_reply_bytes_arrived(kept, prober_for):
    def half_a_head(ex: Exchange) -> None:
        ex.write(b"HTTP/1.1 200 OK\r\nContent-Le")
        ex.close_connection = True

    prober = prober_for(make_target(kept.url))
    assert prober.probe_health().ok
    kept.routes["/health"] = half_a_head
    assert prober.probe_health().outcome is ProbeOutcome.ERROR
    assert (kept.connections, len(kept.requests)) == (1, 2)


@pytest.mark.integration
def test_completion_probe_uses_a_connection_of_its_own(kept, prober_for):
    kept.routes["/v1/completions"] = say_nothing
    prober = prober_for(make_target(kept.url))
    assert prober.probe_health().ok
    assert prober.probe_completion().outcome is ProbeOutcome.ERROR  # fresh: never retried
    kept.routes["/v1/completions"] = reply(200, CHOICES)
    assert prober.probe_completion().ok
    assert prober.probe_health().ok
    # health kept one connection across; each completion opened (and closed) its own
    assert (kept.connections, len(kept.requests)) == (3, 4)


@pytest.mark.integration
def test_a_stopped_server_is_refused_and_a_restarted_one_answers(prober_for):
    with LoopbackServer({"/health": reply(200, b"")}, keep_alive=True) as first:
        port = first.port
        prober = prober_for(make_target(first.url))
        assert prober.probe_health().ok
    assert prober.probe_health().outcome is ProbeOutcome.REFUSED
    with LoopbackServer({"/health": reply(200, b"")}, keep_alive=True, port=port) as again:
        assert outcomes([prober.probe_health() for _ in range(2)]) == [OK, OK]
        assert again.connections == 1


POISONS = {  # id: (route, outcome): replies that leave the connection unfit for another
    "401-body-not-read": (reply(401, {"error": "invalid api key"}), ProbeOutcome.UNAUTHORIZED),
    "body-over-the-cap": (endless(1 << 20), ProbeOutcome.BODY_TOO_LARGE),
    "undecodable-body": (
        reply(200, b"\x00\x01", headers={"Content-Encoding": "br"}), ProbeOutcome.BAD_BODY,
    ),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize(("route", "outcome"), POISONS.values(), ids=POISONS.keys())
def test_an_unfinished_reply_does_not_poison_the_next_probe(kept, prober_for, route, outcome):
    prober = prober_for(make_target(kept.url), max_body_bytes=CAP)
    assert prober.probe_health().ok
    kept.routes["/health"] = route
    assert prober.probe_health().outcome is outcome
    kept.routes["/health"] = reply(200, b"")
    assert prober.probe_health().ok
    assert kept.connections == 2


@pytest.mark.integration
@pytest.mark.parametrize("route", [hang(), trickle(0.2)], ids=["hang", "body-trickles"])
def test_the_total_deadline_holds_on_a_reused_connection(kept, prober_for, route):
    prober = prober_for(make_target(kept.url, timeout=0.5))
    assert prober.probe_health().ok
    kept.routes["/health"] = route
    started = time.monotonic()
    result = prober.probe_health()
    wall = time.monotonic() - started
    assert result.outcome is ProbeOutcome.TIMEOUT
    assert 0.5 <= wall < 1.0
    assert kept.connections == 1  # it was the kept connection that hung
    kept.routes["/health"] = reply(200, b"")
    assert prober.probe_health().ok
    assert kept.connections == 2  # the one the watchdog shut was dropped


@pytest.mark.integration
def test_vllm_health_and_sleep_state_share_one_connection(kept, prober_for):
    kept.routes["/health"] = reply(200, b"")
    kept.routes["/is_sleeping"] = reply(200, {"is_sleeping": False})
    prober = prober_for(vllm_target(kept.url))
    results = [prober.sample() for _ in range(3)]
    assert all(r.ok and r.sleeping is False for r in results)
    assert [r.path for r in kept.requests] == ["/health", "/is_sleeping"] * 3
    assert kept.connections == 1


@pytest.mark.integration
def test_close_drops_the_kept_connection(kept, prober_for):
    prober = prober_for(make_target(kept.url))
    assert prober.probe_health().ok
    prober.close()
    assert prober.probe_health().ok  # still answers after close, over a new connection
    assert prober.probe_health().ok  # ... and keeps none: a closed prober holds no socket
    assert kept.connections == 3
