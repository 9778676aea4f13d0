"""record/replay: traces round-trip, and a recorded live cold start replays to the same timeline."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from exporter.base.model import (
    FailureReason,
    LogClass,
    LogEvent,
    Observation,
    Phase,
    ProbeKind,
    ProbeOutcome,
    ProbeResult,
    ProcessSample,
)
from exporter.commands.replay import read_trace, replay
from exporter.core.lifecycle import Thresholds
from exporter.trace import (
    observation_from_json,
    observation_to_json,
    thresholds_from_json,
    thresholds_to_json,
)
from tests.integration.harness import ROOT, simulator, target_toml


def test_observation_and_thresholds_round_trip_through_json():
    obs = Observation(
        target="t",
        at=1.5,
        process=ProcessSample(1, 0.5, (1, 2), 10, 1.0, None, "permission_denied"),
        health=ProbeResult(ProbeKind.HEALTH, ProbeOutcome.HTTP_STATUS, 503, 0.1, 1.4, loading=True),
        gpu_memory_bytes=7,
        log_events=(
            LogEvent(LogClass.FATAL, "oom", 1.0, fatal_reason=FailureReason.OOM),
            LogEvent(
                LogClass.PROGRESS,
                "bar",
                1.1,
                phase=Phase.LOADING,
                progress=(3, 8),
                progress_key="shards",
            ),
        ),
    )
    assert observation_from_json(json.loads(json.dumps(observation_to_json(obs)))) == obs
    th = Thresholds(weights_bytes=5, expected_phase_seconds={Phase.LOADING: 3.0})
    assert thresholds_from_json(json.loads(json.dumps(thresholds_to_json(th)))) == th


def test_a_malformed_trace_line_is_named():
    with pytest.raises(ValueError, match=r"trace.jsonl:2: not JSON"):
        list(read_trace(['{"kind":"header"}', "{oops"], "trace.jsonl"))


def _completion_answered(tick: dict) -> bool:
    completion = tick["observation"].get("completion")
    return bool(completion) and completion.get("outcome") == "ok"


def ticks(trace) -> list[dict]:
    """The tick records written so far (a line being written is left for the next read)."""
    lines = trace.read_text().splitlines() if trace.exists() else []
    return [d for line in lines if line.endswith("}") and (d := json.loads(line))["kind"] == "tick"]


def wait_for_tick(trace, proc, predicate, timeout=60.0) -> None:
    """Until a recorded tick satisfies ``predicate``, however slow the machine is."""
    deadline = time.monotonic() + timeout
    while not any(predicate(t) for t in ticks(trace)):
        assert proc.poll() is None and time.monotonic() < deadline, "no such tick recorded"
        time.sleep(0.05)


def _seen_before_its_load(trace) -> bool:
    """A recorded tick saw the engine's process before any tick carried the log line that
    announces its load: the lifecycle had a tick of its starting phase to see."""
    recorded = [t["observation"] for t in ticks(trace)]
    found = next(i for i, o in enumerate(recorded) if o["process"])
    announced = (i for i, o in enumerate(recorded) if _announces_loading(o))
    return found < next(announced, len(recorded))


def _announces_loading(observation: dict) -> bool:
    return any(e["phase"] == "loading" for e in observation["log_events"])


@pytest.mark.integration
def test_recorded_cold_start_replays_to_the_live_timeline_exactly(tmp_path):
    # The engine starts after the recorder's first tick, so the whole start is in the trace
    # even when the machine is busy (the first tick used to come after "starting" was over),
    # and the recorder stops once it has seen the engine ready, not after a fixed time.
    with simulator(tmp_path, init_seconds=1.0, launch=False) as sim:
        config = tmp_path / "c.toml"
        config.write_text('[exporter]\ninterval = "0.25s"\n' + target_toml("r", sim))
        trace = tmp_path / "trace.jsonl"
        argv = [sys.executable, "-m", "exporter", "record", "--config.file", str(config)]
        with subprocess.Popen([*argv, "--out", str(trace)], cwd=ROOT) as record:
            try:
                wait_for_tick(trace, record, lambda t: True)
                sim.launch()
                sim.ready_at()
                wait_for_tick(trace, record, _completion_answered)
                record.send_signal(signal.SIGTERM)
                assert record.wait(timeout=60) == 0
            finally:
                record.kill()
    with trace.open() as f:
        result = replay(read_trace(f, str(trace)))
    assert result.recorded["r"], "the live timeline is in the trace"
    assert result.matches()
    assert result.states["r"].phase in (Phase.READY, Phase.SERVING)
    out = subprocess.run(
        [sys.executable, "-m", "exporter", "replay", str(trace), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["matches_recorded"] is True
    shown = [t["to"] for t in doc["targets"]["r"]["transitions"]]
    assert shown == [t["to"] for t in result.recorded["r"]]  # the JSON is the live timeline
    # From its start: starting, then loading; a busy machine's first tick that found the
    # engine may have come only once its log announced the load, and then loading is first.
    first = ["starting", "loading"] if _seen_before_its_load(trace) else ["loading"]
    assert shown[: len(first)] == first, shown
