"""replay-log against the real engine logs in ../shared/fixtures/logs, read where they are.

The expected outcome and reason of every file come from that folder's README table, so a
fixture added there without a verdict, or a verdict the replay disagrees with, fails here.
Without the corpus the module is skipped (see ``tests.corpus``).
"""

from __future__ import annotations

import json
import re

import pytest

from exporter.base.model import LogClass
from exporter.cli import main
from exporter.commands.replay_log import detect_engine, read_lines, replay
from tests import corpus

LOGS = corpus.require()
EXPECTED = corpus.expected_results(LOGS)
#: Files in which nothing names the engine (PyTorch NCCL lines, a transformers warning).
UNNAMED = frozenset({"tgi-04-nccl.log", "tgi-12-nccl.log"})
FILES = sorted(p.name for p in LOGS.glob("*.log"))


def test_every_fixture_has_a_verdict_in_the_readme():
    assert FILES, f"no fixture logs found in {LOGS}"
    assert set(FILES) == set(EXPECTED)


@pytest.mark.parametrize("name", FILES)
def test_each_fixture_replays_to_the_readme_outcome_and_reason(name):
    engine = name.split("-", 1)[0]
    result = replay(read_lines(LOGS / name), engine)
    assert (result.outcome, result.reason) == EXPECTED[name]


@pytest.mark.parametrize("name", FILES)
def test_auto_recognises_the_engine_and_reaches_the_same_verdict(name):
    lines = read_lines(LOGS / name)
    detected = detect_engine(text for _, text in lines)
    # tgi-04/12-nccl are PyTorch NCCL lines: nothing in them names the engine.
    assert detected == (None if name in UNNAMED else name.split("-", 1)[0])
    result = replay(lines, None)
    assert (result.outcome, result.reason) == EXPECTED[name]


def test_a_tell_tale_anchored_at_a_line_start_names_the_engine_mid_log():
    # The lines are screened as one text: "^" must still mean each line's start.
    lines = ["starting the server", "Load weight begin. avail mem=78.50 GB"]
    assert detect_engine(lines) == "sglang"
    assert replay(list(enumerate(lines, 1)), None).engine_line == 2


def test_a_tell_tale_split_across_two_lines_names_no_engine():
    # Read as one text, the two lines hold Triton's "^I0601 12:00:00.1\s+42 server.cc:1]"
    # ("\s" crosses the line end): no line names Triton.
    assert detect_engine(["I0601 12:00:00.1", "42 server.cc:1] started"]) is None


def test_the_most_named_engine_wins_and_its_first_line_is_the_one_reported():
    lines = ["vllm serve my-model", "Load weight begin. x", "Load weight end. y", "plain"]
    result = replay(list(enumerate(lines, 1)), None)
    assert (result.engine, result.engine_line) == ("sglang", 2)


def test_phases_follow_the_log_and_carry_the_lines_timestamps():
    result = replay(read_lines(LOGS / "sglang-05-ready.log"), "sglang")
    assert [(p.phase, p.line) for p in result.phases] == [
        ("starting", 4),
        ("loading", 39),  # Load weight begin
        ("initializing", 141),  # Load weight end
        ("ready", 183),  # The server is fired up and ready to roll!
    ]
    ready = result.phases[-1]
    assert ready.at is not None
    assert result.phases[1].at is not None and ready.at - result.phases[1].at == 357.0
    # The draft model's 1-shard bar does not replace the target model's 15 shards.
    assert result.progress == ("shards", 15, 15)


def test_a_log_without_timestamps_replays_in_line_order():
    result = replay(read_lines(LOGS / "llamacpp-01-ready.log"), "llamacpp")
    assert [p.phase for p in result.phases] == ["starting", "loading", "initializing", "ready"]
    assert {p.at for p in result.phases} == {None}


def test_json_output_is_the_documented_object(capsys):
    assert main(["replay-log", "--json", str(LOGS / "sglang-03-oom.log")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "engine",
        "engine_source",
        "engine_line",
        "outcome",
        "reason",
        "reason_detail",
        "phases",
        "progress",
        "classes",
    }
    assert (doc["engine"], doc["engine_source"]) == ("sglang", "detected")
    assert isinstance(doc["engine_line"], int)
    assert (doc["outcome"], doc["reason"]) == ("failed", "oom")
    assert doc["reason_detail"].startswith("line 447: ")
    assert "HIP out of memory" in doc["reason_detail"]
    assert doc["phases"][-1]["phase"] == "failed"
    assert doc["phases"][-1]["line"] == 447
    assert doc["phases"][-1]["at"] is None  # the OOM line is raw stderr, without a timestamp
    assert doc["phases"][-2] == {"phase": "loading", "line": 374, "at": doc["phases"][-2]["at"]}
    assert isinstance(doc["phases"][-2]["at"], float)
    assert doc["progress"] is None
    assert set(doc["classes"]) == {
        "marker",
        "progress",
        "info",
        "warning",
        "benign",
        "error",
        "fatal",
    }
    assert doc["classes"]["fatal"] >= 1 and doc["classes"]["benign"] > 0


def test_text_output_names_engine_timeline_and_outcome(capsys):
    assert main(["replay-log", str(LOGS / "vllm-06-ready.log")]) == 0
    out = capsys.readouterr().out
    assert "engine    vllm (detected at line 4)" in out
    assert re.search(r"^\s+23  \d{4}-05-12 02:45:35  initializing$", out, re.M)
    assert re.search(r"^\s+64  -\s+ready$", out, re.M)  # uvicorn's line has no timestamp
    assert "progress  4/4 shards" in out
    assert "outcome   ready" in out


def test_an_unreadable_file_is_one_line_and_exit_2(capsys, tmp_path):
    missing = tmp_path / "nope.log"
    assert main(["replay-log", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{missing}: cannot read: No such file or directory"]


def test_carriage_returns_are_kept_as_updates_of_one_line(tmp_path):
    log = tmp_path / "bars.log"
    bars = "".join(
        f"\rLoading safetensors checkpoint shards: {i * 20:3d}% Completed | {i}/5 [00:0{i}<00:05]"
        for i in range(6)
    )
    log.write_bytes(
        b"INFO 05-12 02:45:31 [gpu_model_runner.py:1329] Starting to load model /m...\n"
        + bars.encode()
        + b"\nINFO 05-12 02:45:35 [loader.py:458] Loading weights took 3.83 seconds\n"
    )
    result = replay(read_lines(log), "vllm")
    assert result.progress == ("shards", 5, 5)
    assert result.classes[LogClass.PROGRESS] == 6
    assert [(p.phase, p.line) for p in result.phases] == [("loading", 1), ("initializing", 3)]


def test_a_bar_logged_a_line_an_update_moves_the_phase_at_its_first_line(tmp_path):
    # Lines of a bar in its own phase go with the next step, as in a tick; the bar that
    # begins loading still moves the phase at its own line, and the end still moves it on.
    log = tmp_path / "bars.log"
    bars = [
        f"Loading safetensors checkpoint shards: {i * 20:3d}% Completed | {i}/5 [00:0{i}<00:05]"
        for i in range(6)
    ]
    lines = [
        "INFO 05-12 02:45:30 [api_server.py:1] vLLM API server version 0.9.0",
        *bars,
        "INFO 05-12 02:45:35 [loader.py:458] Loading weights took 3.83 seconds",
    ]
    log.write_text("".join(f"{line}\n" for line in lines))
    result = replay(read_lines(log), "vllm")
    assert result.progress == ("shards", 5, 5)
    assert result.classes[LogClass.PROGRESS] == 6
    assert [(p.phase, p.line) for p in result.phases] == [
        ("starting", 1),
        ("loading", 2),
        ("initializing", 8),
    ]


def test_a_panic_after_the_listening_line_replays_as_a_failed_start(tmp_path):
    # Issue 33: an engine without a profile prints its listening line, then its runtime
    # gives up before any request: replay-log (which has no probe) calls the start failed.
    log = tmp_path / "server.log"
    log.write_text(
        "2025/01/01 00:00:01 loading config\n"
        "2025/01/01 00:00:02 Server listening on http://0.0.0.0:8080\n"
        "panic: runtime error: invalid memory address or nil pointer dereference\n"
        "goroutine 1 [running]:\n"
        "main.main()\n"
    )
    result = replay(read_lines(log), "generic", reference=1.7e9)
    assert result.outcome == "failed"
    assert result.reason is not None and str(result.reason) == "crash"
    assert result.reason_detail is not None and "panic: runtime error" in result.reason_detail


#: A request access line: a log holding one is walked as a block, as the daemon reads it.
ACCESS = 'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK'


@pytest.mark.parametrize("name", [n for n in FILES if len(read_lines(LOGS / n)) > 1])
def test_a_log_read_line_by_line_concludes_what_its_block_walk_would(name):
    # A start-up is read line by line up to the first request line; one request line right
    # after the first line sends the same lines through the block walk.
    lines = read_lines(LOGS / name)
    first = lines[0][0]
    walked = [lines[0], (first + 1, ACCESS), *((n + 1, text) for n, text in lines[1:])]
    engine = detect_engine(text for _, text in lines) or "openai"
    by_line, by_block = replay(lines, engine), replay(walked, engine)
    assert by_block.classes[LogClass.BENIGN] == by_line.classes[LogClass.BENIGN] + 1
    assert {**by_block.classes, LogClass.BENIGN: 0} == {**by_line.classes, LogClass.BENIGN: 0}
    shifted = [(p.phase, p.line - (p.line > first), p.at) for p in by_block.phases]
    assert shifted == [(p.phase, p.line, p.at) for p in by_line.phases]
    assert (by_block.outcome, by_block.reason) == (by_line.outcome, by_line.reason)
