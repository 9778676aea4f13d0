"""What the page tests share: a headless Chromium, the page read back, a snapshot to draw.

Debian packages ``chromium`` and ``chromium-driver`` provide the browser; none is downloaded.
The ``browser`` and ``page`` fixtures (``conftest.py``) are built on ``chromium``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from exporter.base.model import Phase
from exporter.base.records import ColdStart
from exporter.core.lifecycle import TargetState, initial_state
from tests.integration.harness import ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = ROOT / "artifacts"
T0 = 1_700_000_000.0

#: Everything the tests read from the page, in one call (the page redraws every second).
READ_CARDS = """
const pathOf = (s, sel) => (s.querySelector(sel) || { getAttribute: () => "" }).getAttribute("d");
return Array.from(document.querySelectorAll("section.target")).map((c) => {
  const bar = c.querySelector(".progress .bar"), fill = c.querySelector(".progress .fill");
  const stall = c.querySelector(".badge.stall");
  return {
    target: c.dataset.target,
    phase: c.querySelector(".badge.phase").textContent,
    stalled: !!stall && stall.getBoundingClientRect().width > 0,
    progress: fill ? fill.getBoundingClientRect().width / bar.getBoundingClientRect().width : null,
    eta: fill ? c.querySelector(".progress .eta").textContent : null,
    reason: c.querySelector(".reason").textContent,
    rows: Array.from(c.querySelectorAll(".tl-row")).map((r) => ({
      label: r.querySelector(".label").textContent,
      segments: Array.from(r.querySelectorAll(".seg")).map((s) => s.textContent),
      total: r.querySelector(".total").textContent,
    })),
    gpus: Array.from(c.querySelectorAll(".gpu")).map((g) =>
      Array.from(g.children).map((x) => x.textContent).filter(Boolean)),
    lines: Array.from(c.querySelectorAll(".lines .text")).map((e) => e.textContent),
    earlier: Array.from(c.querySelectorAll(".lines li.earlier")).map((e) => e.textContent),
    images: c.querySelectorAll("img").length,
    strips: Array.from(c.querySelectorAll(".strip")).map((s) => ({
      title: s.querySelector(".strip-title").textContent,
      current: pathOf(s, "path.current"),
      previous: pathOf(s, "path.previous"),
      bands: Array.from(s.querySelectorAll("rect.band")).map((r) => r.getAttribute("class")),
      marks: Array.from(s.querySelectorAll("line.mark title")).map((t) => t.textContent),
      threshold: !!s.querySelector("line.threshold"),
    })),
  };
});
"""


@contextmanager
def chromium(profile: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium through its WebDriver, its console kept for the tests to read."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1200,1000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def cards(driver) -> dict[str, dict[str, Any]]:
    return {c["target"]: c for c in driver.execute_script(READ_CARDS)}


def until(
    driver, check: Callable[[dict[str, dict[str, Any]]], bool], what: str, timeout: float = 60
) -> dict[str, dict[str, Any]]:
    """Read the page every 0.2 s until ``check`` holds; return what it showed then."""
    deadline = time.monotonic() + timeout
    seen: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        seen = cards(driver)
        try:
            if check(seen):
                return seen
        except (KeyError, IndexError):  # a card not drawn yet (the first /status in flight)
            pass
        time.sleep(0.2)
    raise AssertionError(f"page never showed {what}; last: {seen}")


def severe_console_messages(driver) -> list[str]:
    """Console errors; a CSP violation (a blocked inline script or style) would be one."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def loading_after(previous: tuple[tuple[Phase, float], ...], **fields: Any) -> TargetState:
    """``kimi`` loading since ``T0 + 30`` (30 s starting), its last start an hour before,
    ready after the ``previous`` phases; ``fields`` set the rest of the state."""
    prev = ColdStart(
        T0 - 3600, T0 - 3600 + sum(s for _, s in previous), "ready", None, previous, (), None, None
    )
    return replace(
        initial_state("kimi"),
        phase=Phase.LOADING,
        phase_since=T0 + 30,
        create_time=T0,
        started_at=T0,
        phase_seconds=((Phase.STARTING, 30.0),),
        last_cold_start=prev,
        **fields,
    )
