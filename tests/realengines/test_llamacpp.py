"""The real exporter watching a real llama.cpp ``llama-server`` through cold starts.

llama-server is built from the llama.cpp source in the llama-cpp-python sdist (``make
real-engines``); the models are seeded random GGUFs made by ``make_tiny_gguf.py``. The engine
writes its real log to a file and is found by its command line, as in production.
"""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import ROOT, exporter, free_port
from tests.realengines.engines import (
    ORDER,
    EngineProcess,
    complete,
    drop_from_page_cache,
    engine_process,
    llama_server_cmd,
    target_toml,
    throttle_unavailable,
    throttled_reads,
    watch,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.integration]
INTERVAL = 0.5
RESTARTS = 10
SLOW_TICK = 1.0
#: 105 MB at 40 MiB/s: loading lasts about 2.5 s, five ticks.
THROTTLE_BYTES_PER_SECOND = 40 * 2**20


def _llama_target(port: int, log_file: Path, model: Path) -> str:
    return target_toml(
        "llama",
        "llamacpp",
        port,
        process_regex=rf"llama-server .*--port {port}( |$)",
        log_file=log_file,
        model_path=model,
        completion_model="any-name",  # llama-server serves its one model under any name
        interval=INTERVAL,
    )


@contextlib.contextmanager
def _throttled_llama(
    llama_server: Path, model: Path, port: int, log_file: Path, load_mode: str
) -> Iterator[EngineProcess]:
    """llama-server loading ``model`` with its disk reads throttled, so a cold load lasts."""
    with (
        throttled_reads(model, THROTTLE_BYTES_PER_SECOND) as cgroup,
        engine_process(
            llama_server_cmd(llama_server, model, port, load_mode=load_mode),
            log_file,
            port,
            cgroup=cgroup,
        ) as engine,
    ):
        yield engine


def test_throttled_cold_start_is_seen_loading_then_ready_then_serving(
    tmp_path, llama_server, gguf_models
):
    model = gguf_models["medium"]
    if reason := throttle_unavailable(model):
        pytest.skip(f"cannot make the load last seconds: {reason}")
    port, log_file = free_port(), tmp_path / "llama-server.log"
    with exporter(tmp_path, _llama_target(port, log_file, model), interval=INTERVAL) as exp:
        assert exp.target("llama")["phase"] == "down"
        with _throttled_llama(llama_server, model, port, log_file, "dio") as engine:
            timeline = watch(
                exp,
                "llama",
                lambda d: d["phase"] in ("serving", "failed"),
                timeout=60,
                engine=engine,
            )
            reply = complete(engine.url, "any-name")
    assert reply["choices"] and reply["choices"][0]["finish_reason"] == "length"

    phases = timeline.phases()
    assert phases == [p for p in ORDER if p in phases], phases
    assert {"down", "loading", "ready", "serving"} <= set(phases), phases
    loading = timeline.during("loading")
    # llama.cpp answers 503 {"error":{"message":"Loading model"}} while it reads the weights
    assert any(
        d["probes"]["health"]["status_code"] == 503 and d["probes"]["health"]["loading"]
        for d in loading
    ), loading[-1]["probes"]
    assert max(d["phase_seconds"] for d in loading) >= 1.0
    # O_DIRECT weight reads show in the tree's read_bytes, rising while the phase is loading
    size = model.stat().st_size
    ramp = sorted({d["process"]["read_bytes"] for d in loading if d["process"]})
    assert len([b for b in ramp if 0 < b < size]) >= 2, ramp
    assert any(0 < (d["progress_ratio"] or 0) < 1 for d in loading)
    serving = timeline.samples[-1]
    assert serving["phase"] == "serving", serving["reason"]
    assert serving["process"]["read_bytes"] >= size
    assert serving["probes"]["completion"]["outcome"] == "ok"
    assert serving["last_cold_start"]["outcome"] == "ready"


def test_truncated_model_makes_the_engine_exit_and_is_reported_failed(
    tmp_path, llama_server, gguf_models
):
    whole = gguf_models["tiny"].read_bytes()
    model = tmp_path / "truncated.gguf"
    model.write_bytes(whole[: len(whole) // 2])
    port, log_file = free_port(), tmp_path / "llama-server.log"
    with (
        exporter(tmp_path, _llama_target(port, log_file, model), interval=INTERVAL) as exp,
        engine_process(llama_server_cmd(llama_server, model, port), log_file, port) as engine,
    ):
        assert engine.proc.wait(timeout=30) != 0
        doc = watch(exp, "llama", lambda d: d["phase"] == "failed", timeout=20).samples[-1]
    assert "not within the file bounds" in engine.log_text()
    assert doc["failure_reason"] in ("crash", "exited"), doc["reason"]
    assert any(line["class"] == "fatal" for line in doc["notable_lines"]), doc["notable_lines"]
    assert "ready" not in [t["to"] for t in doc["transitions"]]


def test_wait_returns_zero_once_the_real_engine_is_ready(tmp_path, llama_server, gguf_models):
    model = gguf_models["tiny"]
    port, log_file = free_port(), tmp_path / "llama-server.log"
    with (
        exporter(tmp_path, _llama_target(port, log_file, model), interval=INTERVAL) as exp,
        engine_process(llama_server_cmd(llama_server, model, port), log_file, port),
    ):
        waited = subprocess.run(
            [sys.executable, "-m", "exporter", "wait", "llama", "--url", exp.url]
            + ["--until", "ready"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert waited.returncode == 0, waited.stderr
        assert exp.target("llama")["phase"] in ("ready", "serving")


def test_a_cold_page_cache_reads_disk_and_a_warm_one_the_page_cache(
    tmp_path, llama_server, gguf_models
):
    """Two starts of one model, its pages dropped from the page cache before the first.

    ``--load-mode none`` reads the weights into llama.cpp's own buffers: the cold start's
    reads reach the disk (throttled, so the load lasts seconds) and leave the pages cached,
    the warm one reads them from the cache, which the throttle does not slow. A warm load
    of 105 MB may end within one tick: then its bounds are one phase spanning the whole
    start, and its start is far shorter than the cold one's.
    """
    model = gguf_models["medium"]
    if reason := throttle_unavailable(model):
        pytest.skip(f"cannot make the load last seconds: {reason}")
    port, log_file = free_port(), tmp_path / "llama-server.log"
    with exporter(tmp_path, _llama_target(port, log_file, model), interval=INTERVAL) as exp:
        starts: list[dict] = []
        for warm in (False, True):
            if not warm:
                drop_from_page_cache(model)
            with _throttled_llama(llama_server, model, port, log_file, "none") as engine:
                seen = [s["started_at"] for s in starts]
                done = watch(
                    exp,
                    "llama",
                    lambda d, seen=seen: (
                        d["phase"] == "serving"
                        and d["started_at"] not in seen
                        and bool(d["last_start_bounds"])
                    ),
                    timeout=60,
                    engine=engine,
                ).samples[-1]
            starts.append(done)
    cold, warm = ({b["phase"]: b for b in s["last_start_bounds"]} for s in starts)
    print("cold:", *(b["advice"] for b in cold.values()), sep="\n  ")
    print("warm:", *(b["advice"] for b in warm.values()), sep="\n  ")
    assert cold["loading"]["bound"] == "disk", cold["loading"]
    assert cold["loading"]["read_bytes"] >= model.stat().st_size // 2
    assert "disk-bound" in cold["loading"]["advice"]
    # The warm start's own bounds, never the cold one's, even when over within one tick.
    assert starts[1]["last_start_bounds"] != starts[0]["last_start_bounds"]
    assert "disk" not in [b["bound"] for b in warm.values()], warm
    assert sum(b["read_bytes"] for b in warm.values()) < model.stat().st_size // 10
    took = [sum(b["seconds"] for b in bounds.values()) for bounds in (cold, warm)]
    # Where the weights loaded: its loading phase, or the one phase of a start over within
    # one tick, which spans the whole start (the lifecycle times it as starting).
    whole = list(warm) == ["starting"] and took[1] == pytest.approx(
        starts[1]["last_cold_start"]["duration_seconds"], abs=1e-3
    )
    loaded = warm["loading"] if "loading" in warm else warm["starting"] if whole else None
    if loaded is not None:
        assert loaded["bound"] == "page_cache", loaded
        assert "the weights came from the page cache" in loaded["advice"]
    assert took[1] < took[0] / 2, took


def _cold_start_histogram(metrics: str, target: str) -> tuple[int, float]:
    """``_count`` and ``_sum`` of the target's cold-start histogram (0, 0.0 before any start)."""
    values = {"count": 0.0, "sum": 0.0}
    for part in values:
        m = re.search(
            rf'^inference_server_cold_start_duration_seconds_{part}\{{target="{target}"\}} (\S+)$',
            metrics,
            re.M,
        )
        values[part] = float(m.group(1)) if m else 0.0
    return int(values["count"]), values["sum"]


def _ready_again(exp, engine, known: list[float]) -> dict:
    """The first ``/status`` document showing a process not in ``known`` ready (or serving).

    A start over between a tick's process scan and its probe is ready a tick before its
    process (and its start time) is found.
    """
    return watch(
        exp,
        "llama",
        lambda d: d["phase"] in ("ready", "serving") and d["started_at"] not in (None, *known),
        timeout=60,
        engine=engine,
    ).samples[-1]


def test_ten_back_to_back_restarts_are_ten_timed_cold_starts(tmp_path, llama_server, gguf_models):
    """The tiny model is ready within a tick; each restart follows the last without a pause.

    A restart comes as soon as the exporter has seen the running process ready, so the new
    process is ready at its first sample, often with no ``down`` tick between the two.
    """
    model = gguf_models["tiny"]
    port, log_file = free_port(), tmp_path / "llama-server.log"
    cmd = llama_server_cmd(llama_server, model, port)
    starts: dict[float, dict] = {}
    with exporter(tmp_path, _llama_target(port, log_file, model), interval=INTERVAL) as exp:
        with contextlib.ExitStack() as running:
            engine = running.enter_context(engine_process(cmd, log_file, port))
            first = _ready_again(exp, engine, [])
            before = _cold_start_histogram(exp.metrics(), "llama")
            known = [first["started_at"]]
            for _ in range(RESTARTS):
                engine.stop()
                engine = running.enter_context(engine_process(cmd, log_file, port))
                doc = _ready_again(exp, engine, known)
                known.append(doc["started_at"])
                starts[doc["started_at"]] = doc["last_cold_start"]
        deadline = time.monotonic() + 10 * INTERVAL
        after = _cold_start_histogram(exp.metrics(), "llama")
        while after[0] < before[0] + RESTARTS and time.monotonic() < deadline:
            time.sleep(0.1)
            after = _cold_start_histogram(exp.metrics(), "llama")
        transitions = exp.target("llama")["transitions"]
    print("cold starts:", *(f"{s and s['duration_seconds']}" for s in starts.values()))
    assert after[0] - before[0] == RESTARTS, (before, after, transitions)
    assert len(starts) == RESTARTS
    for started_at, last in starts.items():
        assert last is not None and last["started_at"] == started_at, (started_at, last)
        assert last["outcome"] == "ready" and 0.0 <= last["duration_seconds"] < 30.0, last
    durations = sum(last["duration_seconds"] for last in starts.values())
    assert math.isfinite(after[1] - before[1])
    assert after[1] - before[1] == pytest.approx(durations, abs=0.01 * RESTARTS)


@pytest.mark.parametrize("replacing", [False, True], ids=["from-down", "replacing-a-ready-one"])
def test_wait_started_after_fails_within_two_ticks_when_the_model_path_is_missing(
    tmp_path, llama_server, gguf_models, replacing
):
    """llama-server exits about 5 ms after it starts: no tick samples the process, its log does.

    ``replacing``: a ready server is stopped and the broken one started at once, as
    ``systemctl restart`` after a bad config change does. Ticks of a second: a busy
    two-core box delays a tick by a few hundred milliseconds, not by a second.
    """
    port, log_file = free_port(), tmp_path / "llama-server.log"
    model, missing = gguf_models["tiny"], tmp_path / "no-such-model.gguf"
    with contextlib.ExitStack() as running:
        exp = running.enter_context(
            exporter(tmp_path, _llama_target(port, log_file, model), interval=SLOW_TICK)
        )
        old = None
        if replacing:
            old = running.enter_context(
                engine_process(llama_server_cmd(llama_server, model, port), log_file, port)
            )
            up = _ready_again(exp, old, [])["started_at"]
            # wait allows a second of slack for /proc start times: the restart comes later
            time.sleep(max(0.0, up + 2.0 - time.time()))
        else:
            exp.wait_for(lambda t: t["phase"] == "down", "llama", timeout=20)
        asked = time.time()
        wait = subprocess.Popen(
            [sys.executable, "-m", "exporter", "wait", "llama", "--url", exp.url,
             "--started-after", f"{asked:.3f}", "--timeout", "60s", "--interval", "0.1s"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        running.callback(wait.kill)
        assert wait.stdout is not None
        wait.stdout.readline()  # it has seen the target: the wait is on
        if old is not None:
            old.stop()
        engine = running.enter_context(
            engine_process(llama_server_cmd(llama_server, missing, port), log_file, port)
        )
        assert engine.proc.wait(timeout=30) != 0
        died = time.monotonic()
        out, err = wait.communicate(timeout=90)
        waited = time.monotonic() - died
        doc = exp.target("llama")
    print(f"wait exited {wait.returncode} {waited:.2f} s after the engine died:", err, sep="\n")
    assert "exiting due to model loading error" in engine.log_text()
    assert wait.returncode == 1, (out, err)
    assert waited <= 2 * SLOW_TICK, (waited, err, doc["transitions"])
    assert "fatal log line: crash" in err and "failed to load model" in err, err
    assert doc["phase"] == "failed" and doc["failure_reason"] == "crash", doc["reason"]
    last = doc["last_cold_start"]
    assert last is not None and last["outcome"] == "failed" and last["started_at"] >= asked
