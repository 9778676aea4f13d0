"""The page at ``/``: its CSP allows exactly its inline assets, it loads nothing from elsewhere,
and nothing from the snapshot reaches it as markup. The browser test drives it for real.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporter.core.lifecycle import initial_state
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.render.page import page_assets, page_csp, render_page
from exporter.render.status import status_json
from exporter.web.server import WebRoutes, WebServer

T0 = 1_700_000_000.0


def page_text(snap: Snapshot | None = None) -> str:
    return render_page(snap).decode()


def inline(tag: str, html: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def directives(csp: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}


def test_csp_allows_exactly_the_inline_script_and_style_by_hash():
    html = page_text()
    scripts, styles = inline("script", html), inline("style", html)
    assert len(scripts) == 1 and len(styles) == 1
    policy = directives(page_csp())
    assert policy["script-src"] == [sha256(scripts[0])]
    assert policy["style-src"] == [sha256(styles[0])]
    assert policy["default-src"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"]  # the script fetches ./status and nothing else
    assert "'unsafe-inline'" not in page_csp() and "'unsafe-eval'" not in page_csp()


def test_the_page_loads_nothing_from_another_origin():
    html = page_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert "@import" not in page_assets()[1] and "url(" not in page_assets()[1]


def test_the_script_never_parses_data_as_markup():
    script = page_assets()[0]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script
    assert "</script" not in script.lower()  # it is inlined: this would end the element early


def test_without_javascript_a_table_shows_each_target_escaped():
    state = replace(initial_state("kimi"), reason="<img src=x onerror=alert(1)>")
    snap = Snapshot(taken_at=T0, targets=(TargetSnapshot(TargetInfo("kimi", "sglang"), state),))
    html = page_text(snap)
    fallback = html.split("<noscript>")[1].split("</noscript>")[0]
    assert "<td>kimi</td><td>sglang</td><td>down</td>" in fallback
    assert "&lt;img src=x onerror=alert(1)&gt;" in fallback
    assert "<img" not in fallback


@contextlib.contextmanager
def page_server(snap: Snapshot | None) -> Iterator[str]:
    """The real web server serving ``/`` and ``/status`` for a fixed snapshot; yields its URL."""
    routes = WebRoutes(
        registry=CollectorRegistry(),
        status=lambda: status_json(snap),
        page=lambda: render_page(snap),
        ready=lambda: True,
        page_csp=page_csp(),
    )
    server = WebServer(routes, listen_address="127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


@pytest.mark.integration
def test_the_web_server_sends_the_page_with_its_csp():
    with page_server(None) as url:
        reply = httpx.get(url + "/")
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    assert reply.headers["content-security-policy"] == page_csp()
    assert sha256(inline("script", reply.text)[0]) in reply.headers["content-security-policy"]
