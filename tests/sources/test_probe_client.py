"""The probes' HTTP/1.1 client on its own, against real loopback servers: its bounds hold.

No engine, no target: a base URL, a path, a deadline and a cap, as ``client`` promises.
"""

from __future__ import annotations

import time

import pytest

from exporter.base.model import ProbeOutcome
from exporter.sources.probe.client import Failed, HttpClient, Reply
from tests.httpservers import LoopbackServer, closed_port, gzip_bomb, redirect, reply, trickle

HEADERS = ((b"User-Agent", b"client-test"), (b"Accept-Encoding", b"gzip, deflate"))


def ask(url: str, path: str, *, timeout: float = 2.0, cap: int = 4096, keep: bool = True) -> Reply:
    client = HttpClient(url, path, HEADERS, cap=cap)
    try:
        answer = Reply()
        client.request("GET", path, None, answer, timeout, keep=keep)
        return answer
    finally:
        client.close()


def failure(url: str, path: str, **kwargs: float) -> ProbeOutcome:
    with pytest.raises(Failed) as caught:
        ask(url, path, **kwargs)  # type: ignore[arg-type]
    return caught.value.outcome


def test_a_reply_arrives_with_its_status_and_body():
    with LoopbackServer({"/health": reply(200, {"status": "ok"})}) as srv:
        answer = ask(srv.url, "/health")
    assert (answer.status, answer.body) == (200, b'{"status": "ok"}')


def test_a_trickling_server_is_cut_at_the_total_deadline():
    # One byte every 0.1 s never lets a single read time out: only a total deadline ends it.
    with LoopbackServer({"/slow": trickle(0.1)}) as srv:
        started = time.monotonic()
        outcome = failure(srv.url, "/slow", timeout=0.5)
        took = time.monotonic() - started
    assert outcome is ProbeOutcome.TIMEOUT
    assert took < 5.0  # far below the 100 s the trickle would take


def test_the_body_cap_counts_decompressed_bytes():
    # 32 MiB of zeros in about 32 KiB of gzip: refused by what it inflates to.
    with LoopbackServer({"/bomb": gzip_bomb()}) as srv:
        assert failure(srv.url, "/bomb", cap=65536) is ProbeOutcome.BODY_TOO_LARGE


def test_a_redirect_is_reported_not_followed():
    with LoopbackServer({"/old": redirect("/health"), "/health": reply(200)}) as srv:
        answer = ask(srv.url, "/old")
        asked = [r.path for r in srv.requests]
    assert answer.status == 302
    assert asked == ["/old"]


def test_a_refused_connection_says_so():
    assert failure(f"http://127.0.0.1:{closed_port()}", "/health") is ProbeOutcome.REFUSED


def test_the_kept_connection_carries_the_next_request():
    with LoopbackServer({"/health": reply(200)}, keep_alive=True) as srv:
        client = HttpClient(srv.url, "/health", HEADERS, cap=4096)
        try:
            for _ in range(3):
                client.request("GET", "/health", None, Reply(), 2.0, keep=True)
        finally:
            client.close()
        assert len(srv.requests) == 3
        assert srv.connections == 1
