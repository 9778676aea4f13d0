"""The page labels each phase of the timeline with its bound and puts the advice under it.

Real headless Chromium under the exporter's CSP, against the real web server serving a
hand-built snapshot: a slow, disk-bound load whose previous start came from the page cache.
Saves ``artifacts/page-bounds.png`` (the README's screenshot is a copy of it).
"""

from __future__ import annotations

import pytest

from exporter.base.model import Phase, ProcessSample
from exporter.core.advice import THRESHOLDS, verdicts
from exporter.core.bounds import Bounds, PhaseFigures, StartFigures
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from tests.integration.browser import ARTIFACTS, T0, loading_after, until
from tests.render.test_page import page_server

pytestmark = pytest.mark.integration
GiB = 2**30
READ_TIMELINE = """
return Array.from(document.querySelectorAll("section.target")).map((c) => ({
  rows: Array.from(c.querySelectorAll(".tl-row")).map((r) =>
    Array.from(r.querySelectorAll(".seg")).map((s) => s.textContent)),
  advice: Array.from(c.querySelectorAll(".bounds .advice")).map((p) => p.textContent),
}));
"""


def slow_start() -> Snapshot:
    """Loading 9m12s at the disk's best rate; the start before loaded from the page cache."""
    before = StartFigures(
        8,
        T0 - 3600,
        (
            PhaseFigures(Phase.STARTING, 28.0, cpu_seconds=40.0),
            PhaseFigures(
                Phase.LOADING,
                48.0,
                read_bytes=2 * GiB,
                memory_grown_bytes=600 * GiB,
                rss_grown_bytes=600 * GiB,
            ),
            PhaseFigures(Phase.INITIALIZING, 40.0, cpu_seconds=60.0),
        ),
        finished=True,
    )
    now = StartFigures(
        9,
        T0,
        (
            PhaseFigures(Phase.STARTING, 30.0, cpu_seconds=45.0),
            PhaseFigures(Phase.LOADING, 552.0, read_bytes=610 * GiB, cpu_seconds=80.0),
        ),
    )
    judged = verdicts(Bounds(now, (before,), 1.15 * GiB), THRESHOLDS)
    state = loading_after(
        ((Phase.STARTING, 28.0), (Phase.LOADING, 48.0), (Phase.INITIALIZING, 40.0)),
        progress_ratio=0.9,
        reason="reading weights from disk",
    )
    process = ProcessSample(9, T0, (9, 10), 14 * GiB, 125.0, 610 * GiB)
    target = TargetSnapshot(
        TargetInfo("kimi", "vllm", "prod", "Kimi-K2"),
        state,
        process,
        recent_starts=(state.last_cold_start,),
        verdicts=judged,
    )
    return Snapshot(taken_at=T0 + 582, targets=(target,), version="test")


def test_the_timeline_names_each_phase_bound_and_the_advice_says_what_to_do(page):
    with page_server(slow_start()) as url:
        page.get(url + "/")
        until(page, lambda s: len(s) == 1, "the target", 20)
        seen = page.execute_script(READ_TIMELINE)[0]
        ARTIFACTS.mkdir(exist_ok=True)
        page.save_screenshot(str(ARTIFACTS / "page-bounds.png"))
    previous, current = seen["rows"]
    assert previous == ["starting 28s · cpu", "loading 48s · page_cache", "initializing 40s · cpu"]
    assert current == ["starting 30s · cpu", "loading 9m12s · disk"]
    assert seen["advice"][1] == (
        "disk: loading 9m12s: read 610.0 GiB at 1.1 GiB/s; this disk's best seen 1.1 GiB/s: "
        "disk-bound; the fastest earlier start took 48s here, from the page cache "
        "(a cold page cache)"
    )
