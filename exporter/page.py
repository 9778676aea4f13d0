"""The HTML page served at ``/``: a landing page linking the endpoints, with each target's phase.

No I/O; renders from the snapshot. Every value shown is escaped.
"""

from __future__ import annotations

from html import escape

from exporter import __version__
from exporter.snapshot import Snapshot


def render_page(snap: Snapshot | None) -> bytes:
    """The landing page as UTF-8 HTML."""
    rows = []
    for t in snap.targets if snap else ():
        s = t.state
        progress = f"{s.progress_ratio:.0%}" if s.progress_ratio is not None else "-"
        rows.append(
            f"<tr><td>{escape(t.info.name)}</td><td>{escape(t.info.engine)}</td>"
            f"<td>{escape(s.phase.value)}{' (stalled)' if s.stalled else ''}</td>"
            f"<td>{progress}</td><td>{escape(s.reason)}</td></tr>"
        )
    body = "".join(rows) or "<tr><td colspan=5>no sample yet</td></tr>"
    html = (
        "<!doctype html><html><head><meta charset=utf-8>"
        "<title>inference-lifecycle-exporter</title></head><body>"
        f"<h1>inference-lifecycle-exporter {escape(__version__)}</h1>"
        "<p><a href=metrics>/metrics</a> · <a href=status>/status</a> · "
        "<a href=-/healthy>/-/healthy</a> · <a href=-/ready>/-/ready</a></p>"
        "<table><tr><th>target</th><th>engine</th><th>phase</th><th>progress</th>"
        f"<th>why</th></tr>{body}</table></body></html>"
    )
    return html.encode()
