"""The live page in real headless Chromium (WebDriver), under the CSP the exporter sends.

One test follows real simulated cold starts through a real exporter process and saves
``artifacts/page.png``; the other serves a hand-built snapshot to check what needs history.
The browser and the page's reading are shared with the other page tests (``browser.py``).
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from exporter.base.model import FailureReason, GpuSample, LogClass, LogEvent, Phase, ProcessSample
from exporter.core.lifecycle import initial_state
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.render.page import page_csp
from tests.integration.browser import (
    ARTIFACTS,
    T0,
    cards,
    loading_after,
    severe_console_messages,
    until,
)
from tests.integration.harness import (
    ROOT,
    Simulator,
    exporter,
    simulated_nvml,
    simulator,
    stop,
    target_toml,
)
from tests.render.test_page import page_server

pytestmark = pytest.mark.integration
INTERVAL = 0.25
GiB = 2**30
ORDER = ["down", "starting", "loading", "initializing", "ready", "serving"]
XSS = "<img src=x onerror=\"document.title='pwned'\">"


def restart(sim: Simulator) -> None:
    """Stop the simulated engine and start it again with the same flags: a new cold start."""
    old = sim.proc
    stop(old)
    if old.stdout is not None:
        old.stdout.close()
    sim.proc = subprocess.Popen(old.args, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def _drawn_with_the_previous(strips: list[dict[str, Any]]) -> bool:
    """The GPU strip draws this start over the previous one, the read strip this start."""
    gpu, read, _quiet = strips
    return bool(gpu["current"] and gpu["previous"] and read["current"])


def follow_demo(
    driver, midway: Callable[[dict[str, Any]], None]
) -> tuple[list[str], list[float], list[dict[str, Any]]]:
    """Phases and progress the demo card shows until serving, and every card it showed in
    the start's loading and initializing; ``midway`` once, in mid-load."""
    phases: list[str] = []
    progress: list[float] = []
    during: list[dict[str, Any]] = []

    def serving(seen: dict[str, dict[str, Any]]) -> bool:
        demo = seen["demo"]
        if not phases or phases[-1] != demo["phase"]:
            phases.append(demo["phase"])
            if demo["phase"] in ("initializing", "serving"):
                ARTIFACTS.mkdir(exist_ok=True)
                assert driver.save_screenshot(str(ARTIFACTS / f"page-{demo['phase']}.png"))
        if demo["phase"] in ("loading", "initializing"):
            during.append(demo)
        if demo["phase"] == "loading":
            if progress and progress[-1] <= 0.3 < demo["progress"]:
                midway(demo)
            progress.append(demo["progress"])
        return demo["phase"] == "serving"

    until(driver, serving, "demo serving")
    return phases, progress, during


def test_page_follows_a_cold_start_a_stall_and_a_restart(tmp_path, page, nvml_dir):
    browser = page
    stall = 'starting = "20s"\nloading = "2s"\ninitializing = "20s"'
    with (
        simulator(tmp_path, weights_mb=24, read_mbps=6, start_seconds=1.5, init_seconds=2) as demo,
        simulator(tmp_path, scenario="hang-loading", weights_mb=32, read_mbps=16, gpus=1) as hang,
        exporter(
            tmp_path,
            target_toml("demo", demo, interval=INTERVAL)
            + target_toml("hang", hang, stall=stall, interval=INTERVAL),
            interval=INTERVAL,
            **simulated_nvml(demo.gpu_state, nvml_dir),
        ) as exp,
    ):
        with urllib.request.urlopen(exp.url + "/", timeout=5) as reply:
            assert reply.headers["Content-Security-Policy"] == page_csp()
        browser.get(exp.url + "/")
        # The first start: wherever the page joins it, it ends serving with a full bar.
        seen = until(browser, lambda s: s["demo"]["phase"] == "serving", "demo serving")
        seen = until(browser, lambda s: s["demo"]["progress"] > 0.99, "a full bar")
        assert [g[0] for g in seen["demo"]["gpus"]] == ["GPU 0", "GPU 1"]
        assert all(g[1].endswith(" GiB / 79.6 GiB") for g in seen["demo"]["gpus"])

        seen = until(browser, lambda s: s["hang"]["stalled"], "the hang as a stall", 30)
        assert seen["hang"]["phase"] == "loading"
        assert "no progress evidence" in seen["hang"]["reason"]

        with open(hang.log_file, "a") as log:
            log.write(f"ERROR 01-01 00:00:00 weights path {XSS} unreadable\n")
        seen = until(browser, lambda s: any(XSS in x for x in s["hang"]["lines"]), "the line")
        assert seen["hang"]["images"] == 0 and browser.title == "inference-lifecycle-exporter"
        seen = until(
            browser,
            lambda s: any(XSS in m for m in s["hang"]["strips"][0]["marks"]),
            "the line as a mark on the strip",
            20,
        )
        assert seen["hang"]["images"] == 0 and browser.title == "inference-lifecycle-exporter"

        # The second start, followed from its first second with the page already open.
        restart(demo)
        shown: list[dict[str, Any]] = []

        def midway(card: dict[str, Any]) -> None:
            ARTIFACTS.mkdir(exist_ok=True)
            assert browser.save_screenshot(str(ARTIFACTS / "page.png"))
            assert browser.save_screenshot(str(ARTIFACTS / "page-loading.png"))
            shown.append(card)

        until(browser, lambda s: s["demo"]["phase"] != "serving", "the old process gone", 20)
        phases, progress, during = follow_demo(browser, midway)
        assert phases == [p for p in ORDER if p in phases], phases  # in lifecycle order
        assert {"starting", "loading", "serving"} <= set(phases), phases
        assert len(set(progress)) >= 3 and progress == sorted(progress), progress  # it moves
        assert shown, "no screenshot in mid-load"
        previous, current = shown[0]["rows"]
        assert (previous["label"], current["label"]) == ("previous", "this start")
        assert previous["total"].startswith("ready in ")
        steps = [s.split()[0] for s in previous["segments"]]
        # (the exporter may have first seen that start already loading)
        assert steps[-2:] == ["loading", "initializing"] and steps == sorted(steps, key=ORDER.index)
        assert [s.split()[0] for s in current["segments"]] == ["starting", "loading"]
        assert "usually ready in " in shown[0]["eta"]  # the daemon's history median
        # The strips: drawn as the start unfolds, the previous start faint under it. The page
        # reads /trail every third poll of /status: the strips may lag the bar by a poll or two.
        drawn = [c["strips"] for c in during if _drawn_with_the_previous(c["strips"])]
        assert drawn, f"no strips drawn before serving: {during[-1:]}"
        gpu, _read, quiet = drawn[0]
        assert gpu["title"].startswith("GPU memory") and quiet["title"].startswith("time since")
        assert {"band phase-starting", "band phase-loading"} <= set(gpu["bands"])
        assert quiet["threshold"]  # the stall threshold drawn on the quiet strip
        later = until(
            browser,
            lambda s: "band phase-serving" in s["demo"]["strips"][0]["bands"],
            "the serving band",
            20,
        )["demo"]["strips"][0]
        assert len(later["current"]) > len(gpu["current"])  # it grew
        assert severe_console_messages(browser) == []


CARD_COLOURS = """
const card = getComputedStyle(document.querySelector("section.target"));
const reason = getComputedStyle(document.querySelector("section.target .reason"));
return {background: card.backgroundColor, text: reason.color};
"""


def luminance(rgb: str) -> float:
    """Relative brightness of a computed ``rgb(r, g, b)`` colour, 0 (black) to 1 (white)."""
    r, g, b = (int(x) / 255 for x in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def history_snapshot() -> Snapshot:
    """A target loading its third start with history, and a failed one, with hostile text."""
    loading = loading_after(
        ((Phase.STARTING, 40.0), (Phase.LOADING, 420.0), (Phase.INITIALIZING, 180.0)),
        progress_ratio=0.45,
        eta_seconds=260.0,
        reason="shard progress in logs",
        # The previous start's fatal line is still among the notable lines of this one.
        notable_lines=(
            LogEvent(
                LogClass.FATAL, "CUDA out of memory", T0 - 2990, fatal_reason=FailureReason.OOM
            ),
            LogEvent(LogClass.ERROR, "retrying shard 3", T0 + 100),
        ),
    )
    fatal = LogEvent(LogClass.FATAL, f"NCCL error {XSS}", T0 + 50, fatal_reason=FailureReason.NCCL)
    failed = replace(
        initial_state("llama"),
        phase=Phase.FAILED,
        phase_since=T0 + 50,
        failure_reason=FailureReason.NCCL,
        reason="fatal log line: nccl",
        notable_lines=(fatal,),
    )
    gpus = tuple(GpuSample(i, f"GPU-{i}", "H200", True, 40 * GiB, 141 * GiB) for i in range(4))
    process = ProcessSample(9, T0, (9, 10, 11), 14 * GiB, 300.0, 200 * GiB)
    return Snapshot(
        taken_at=T0 + 230,
        targets=(
            TargetSnapshot(
                TargetInfo("kimi", "sglang", "prod", "kimi-k2"),
                loading,
                process,
                tuple((i, 38 * GiB) for i in range(4)),
                recent_starts=(loading.last_cold_start,),
                typical_start_seconds=640.0,
            ),
            TargetSnapshot(TargetInfo("llama", "llamacpp"), failed),
        ),
        gpus=gpus,
        version="test",
    )


def test_page_shows_history_gpus_and_failures_from_a_snapshot(page):
    browser = page
    with page_server(history_snapshot()) as url:
        browser.get(url + "/")
        seen = until(browser, lambda s: len(s) == 2, "both targets", 20)
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "page-history.png"))
        assert severe_console_messages(browser) == []  # nothing blocked by the CSP
        light = browser.execute_script(CARD_COLOURS)
        dark_mode = {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", dark_mode)
        dark = browser.execute_script(CARD_COLOURS)
        browser.save_screenshot(str(ARTIFACTS / "page-history-dark.png"))
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        # Legible both ways: dark text on a light card, light text on a dark one.
        assert luminance(light["background"]) > 0.8 > 0.3 > luminance(light["text"])
        assert luminance(dark["background"]) < 0.2 < 0.6 < luminance(dark["text"])
        for width, height in ((1280, 800), (390, 844)):  # a laptop, a phone
            browser.set_window_size(width, height)
            until(browser, lambda s: len(s) == 2, f"the page at {width}px", 10)
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"{overflow}px wider than a {width}px window"
        browser.save_screenshot(str(ARTIFACTS / "page-phone.png"))
        browser.set_window_size(1200, 1000)
    banner = browser.find_element(By.ID, "conn")
    WebDriverWait(browser, 10, poll_frequency=0.2).until(lambda _: banner.is_displayed())
    assert banner.text.startswith("cannot read /status")
    assert len(cards(browser)) == 2  # the last good view stays while the exporter is away
    kimi, llama = seen["kimi"], seen["llama"]
    assert kimi["eta"].startswith("ETA 4m20s · usually ready in 10m40s")
    assert [r["label"] for r in kimi["rows"]] == ["previous", "this start"]
    assert kimi["rows"][0]["segments"] == ["starting 40s", "loading 7m00s", "initializing 3m00s"]
    assert kimi["rows"][1]["segments"] == ["starting 30s", "loading 3m20s"]
    assert kimi["gpus"] == [[f"GPU {i}", "38.0 GiB / 141.0 GiB"] for i in range(4)]
    # Issue 30 #18: an earlier start's lines are set apart from this start's.
    assert kimi["lines"] == ["CUDA out of memory", "retrying shard 3"]
    assert len(kimi["earlier"]) == 1 and "(earlier start)" in kimi["earlier"][0]
    assert "CUDA out of memory" in kimi["earlier"][0]
    assert llama["phase"] == "failed" and llama["reason"] == "fatal log line: nccl"
    assert llama["progress"] is None  # no bar for a start that never showed progress
    assert llama["lines"] == [f"NCCL error {XSS}"] and llama["images"] == 0
    assert browser.title == "inference-lifecycle-exporter"
