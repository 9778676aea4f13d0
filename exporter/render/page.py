"""The live page at ``/``: one HTML response with inline CSS and JavaScript polling ``/status``.

Renders only from the snapshot and its packaged assets (read once); the script sets every value
as text, never as markup. ``page_csp()`` allows exactly these inline assets, by hash, and nothing
else: no CDN, no other origin (GPU hosts are often offline).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from html import escape
from importlib import resources
from typing import Final

from exporter import __version__
from exporter.core.snapshot import Snapshot

_LINKS: Final = (
    '<a href="metrics">/metrics</a><a href="status">/status</a>'
    '<a href="-/healthy">/-/healthy</a><a href="-/ready">/-/ready</a>'
)


@functools.cache
def page_assets() -> tuple[str, str]:
    """The page's script and stylesheet, exactly as inlined (and hashed)."""
    static = resources.files("exporter.render") / "static"
    return (static / "page.js").read_text("utf-8"), (static / "page.css").read_text("utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@functools.cache
def page_csp() -> str:
    """The Content-Security-Policy for ``/``: same-origin fetches, the two inline assets only."""
    script, style = page_assets()
    return (
        f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def render_page(snap: Snapshot | None) -> bytes:
    """The page as UTF-8 HTML; without JavaScript it still shows a one-line-per-target table."""
    script, style = page_assets()
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>inference-lifecycle-exporter</title><style>{style}</style></head><body>"
        f'<header><h1>inference-lifecycle-exporter <span class="version">{escape(__version__)}'
        f'</span></h1><nav>{_LINKS}</nav><p id="conn" class="conn" hidden></p></header>'
        f'<main id="targets"><noscript>{_fallback_table(snap)}</noscript></main>'
        f'<footer id="updated"></footer><script>{script}</script></body></html>'
    )
    return html.encode()


def _fallback_table(snap: Snapshot | None) -> str:
    rows = []
    for t in snap.targets if snap else ():
        s = t.state
        progress = f"{s.progress_ratio:.0%}" if s.progress_ratio is not None else "-"
        rows.append(
            f"<tr><td>{escape(t.info.name)}</td><td>{escape(t.info.engine)}</td>"
            f"<td>{escape(s.phase.value)}{' (stalled)' if s.stalled else ''}</td>"
            f"<td>{progress}</td><td>{escape(s.reason)}</td></tr>"
        )
    body = "".join(rows) or '<tr><td colspan="5">no sample yet</td></tr>'
    return (
        '<table class="fallback"><tr><th>target</th><th>engine</th><th>phase</th>'
        f"<th>progress</th><th>why</th></tr>{body}</table>"
    )
