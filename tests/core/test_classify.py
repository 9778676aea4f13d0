"""The log classifier: what an operator would otherwise read off ``journalctl -u UNIT``."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from exporter.base.model import FailureReason, LogClass, LogEvent, Phase
from exporter.config import UserRegex
from exporter.core.classify import MAX_LINE_CHARS, LogClassifier, clean, redact, split_updates
from exporter.engines import ENGINES
from exporter.engines.profile import LogPatterns

AT = datetime(2026, 3, 1, 12, 0, 0).timestamp()


def classify(engine: str, *lines: str, patterns: LogPatterns | None = None):
    c = LogClassifier(ENGINES[engine].log, patterns)
    return [e for n, line in enumerate(lines, 1) for e in c.classify(line, at=AT, line_no=n)]


def local(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> float:
    return datetime(year, month, day, hour, minute, second, us).timestamp()


# --- cleaning and splitting -----------------------------------------------------------------


def test_ansi_codes_are_stripped_raw_and_as_literal_text():
    raw = "\x1b[1;36m(APIServer pid=4394)\x1b[0;0m INFO 10-14 19:26:00 Starting"
    literal = "#033[2m2024-04-18T22:43:58Z#033[0m #033[32m INFO#033[0m Waiting"
    assert clean(raw) == "(APIServer pid=4394) INFO 10-14 19:26:00 Starting"
    assert clean(literal) == "2024-04-18T22:43:58Z  INFO Waiting"


def test_control_characters_are_dropped_but_text_survives():
    assert clean("a\x00b\x07c\td\x7f\n") == "abc\td"


def test_a_coloured_line_loses_its_other_control_characters_too():
    # Colour codes go first; a bell, a carriage return or a lone ESC left after them still go.
    assert clean("\x1b[32mok\x1b[0m\x07 done\r\n") == "ok done"
    assert clean("a\x1bb \x1b[1mc\x1b[0m\td") == "ab c\td"


def test_carriage_return_updates_become_separate_pieces():
    line = "\rbar 0/3 [00:00<?, ?it/s]\rbar 1/3 [00:01<00:02, 1.0it/s]\rbar 3/3 [00:03<00:00]\r\n"
    assert split_updates(line) == [
        "bar 0/3 [00:00<?, ?it/s]",
        "bar 1/3 [00:01<00:02, 1.0it/s]",
        "bar 3/3 [00:03<00:00]",
    ]


def test_a_log_line_glued_after_a_bar_is_split_off():
    # sglang-04-ready line 66: tqdm left the cursor after the bar, the next log line followed.
    line = "  0%|     | 0/13 [00:00<?, ?it/s][2025-03-08 12:29:21 TP1] Capture cuda graph begin."
    assert split_updates(line) == [
        "  0%|     | 0/13 [00:00<?, ?it/s]",
        "[2025-03-08 12:29:21 TP1] Capture cuda graph begin.",
    ]


def test_glued_marker_is_seen_with_its_own_timestamp():
    events = classify(
        "sglang",
        "  0%|     | 0/13 [00:00<?, ?it/s][2025-03-08 12:29:21 TP1] Capture cuda graph begin.",
    )
    assert [e.marker for e in events] == [None, "cuda_graph"]
    assert events[1].phase is Phase.INITIALIZING
    assert events[1].at == local(2025, 3, 8, 12, 29, 21)


def test_every_cr_update_of_a_progress_bar_is_an_event_with_its_count():
    line = "".join(
        f"\rLoading safetensors checkpoint shards: {i * 25:3d}% Completed | {i}/4 [00:0{i}<00:01]"
        for i in range(5)
    )
    events = classify("vllm", line)
    assert [e.progress for e in events] == [(i, 4) for i in range(5)]
    assert {e.cls for e in events} == {LogClass.PROGRESS}
    assert {e.progress_key for e in events} == {"shards"}
    assert {e.phase for e in events} == {Phase.LOADING}


def test_redraws_that_match_nothing_are_counted_and_the_bar_among_them_is_an_event():
    # A curl meter redrawn by \r between a bar's updates (sglang-18-ready's download).
    meter = "  0     0    0     0    0     0      0      0 --:--:-- --:--:-- --:--:--     0"
    bar = "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01]"
    counts: Counter[LogClass] = Counter()
    c = LogClassifier(ENGINES["vllm"].log)
    events = c.classify(f"\r{meter}\r{bar}\r{meter}\r", at=AT, counts=counts)
    assert [e.progress for e in events] == [(1, 2)]
    assert counts == {LogClass.INFO: 2}
    # Without a tally to count in, every piece is an event (each with its class).
    events = c.classify(f"\r{meter}\r{bar}\r{meter}\r", at=AT)
    assert [e.cls for e in events] == [LogClass.INFO, LogClass.PROGRESS, LogClass.INFO]


def test_a_redraw_inside_a_traceback_is_counted_as_its_error_not_as_info():
    c = LogClassifier(ENGINES["vllm"].log)
    c.classify("Traceback (most recent call last):", at=AT)
    counts: Counter[LogClass] = Counter()
    assert c.classify("\r  x = f(y)\r", at=AT, counts=counts) == []
    assert counts == {LogClass.ERROR: 1}
    assert c.in_traceback


def _crash(*lines: str, engine: str = "sglang") -> tuple[list[LogEvent], Counter[LogClass]]:
    """Lines classified as replay-log classifies them: counted where they can only count,
    a line without a timestamp taking the last one read."""
    c, counts = LogClassifier(ENGINES[engine].log), Counter[LogClass]()
    events, last = [], AT
    for n, line in enumerate(lines, 1):
        events += c.classify(line, at=last, line_no=n, counts=counts)
        last = c.last_timestamp or last
    return events, counts


WRAPPER = "[2026-03-01 12:00:00] Scheduler hit an exception: Traceback (most recent call last):"


def test_a_tracebacks_frames_are_counted_and_what_they_show_is_kept():
    # A crash's frames are most of its lines: errors counted, no event. The top frame still
    # makes the bare traceback an uncaught exception (tgi-14-crash): the process ends.
    frames = [
        '  File "/app/serve.py", line 5, in <module>',
        "    main()",
        '  File "/app/serve.py", line 3, in main',
        "    serve_forever(port)",
    ]
    events, counts = _crash("Traceback (most recent call last):", *frames, "RuntimeError: boom")
    assert counts == {LogClass.ERROR: len(frames)}
    assert [(e.line_no, e.cls) for e in events] == [(1, LogClass.ERROR), (6, LogClass.FATAL)]
    assert events[-1].fatal_reason is FailureReason.CRASH


@pytest.mark.parametrize(
    "frame",
    [
        "    connect(api_key='CANARYframe')",  # a secret: redacted in an event
        '  File "/app/fastsafetensors/load.py", line 9, in load',  # a loader's name
        "    raise torch.OutOfMemoryError('CUDA out of memory')",  # a fatal family's line
    ],
)
def test_a_frame_with_a_secret_a_loader_or_a_fatal_line_stays_an_event(frame):
    events, _ = _crash(WRAPPER, frame, "RuntimeError: boom")
    assert [e.line_no for e in events][:2] == [1, 2]
    assert "CANARY" not in events[1].text


def test_a_counted_line_still_gives_its_time_to_the_lines_after_it():
    frame = '[2026-03-01 12:00:05]   File "/sgl/x.py", line 3, in f'
    warning = "[2026-03-01 12:00:07] WARNING something the profile does not know"
    events, counts = _crash(WRAPPER, frame, "RuntimeError: boom", warning, "Error: no time here")
    assert counts == {LogClass.ERROR: 1, LogClass.WARNING: 1}
    assert [(e.line_no, e.at) for e in events] == [
        (1, local(2026, 3, 1, 12, 0, 0)),
        (3, local(2026, 3, 1, 12, 0, 5)),
        (5, local(2026, 3, 1, 12, 0, 7)),
    ]
    assert events[1].cls is LogClass.FATAL


def test_an_excerpt_cut_inside_a_traceback_is_read_as_one_when_counted():
    # vllm-36-crash: a bare frame opens the traceback, its exception line is the cause.
    frame = '  File "/app/x.py", line 3, in f'
    events, counts = _crash(frame, "    g()", "ValueError: bad")
    assert [(e.line_no, e.cls) for e in events][-1] == (3, LogClass.FATAL)
    assert counts == {LogClass.ERROR: 1}
    # A line that is neither frame, source nor exception ends such a traceback.
    events, counts = _crash(frame, "    g()", "the service said hello", "ValueError: bad")
    assert LogClass.FATAL not in {e.cls for e in events}
    assert counts == {LogClass.ERROR: 2, LogClass.INFO: 1}  # the exception line an error


def test_a_traceback_that_never_ends_is_abandoned_after_its_budget_when_counted():
    events, counts = _crash(WRAPPER, *["    pass"] * 250)
    assert events[1].cls is LogClass.FATAL  # the wrapper line, once the budget ran out
    assert events[1].line_no == 1
    assert counts[LogClass.ERROR] < 200


def test_a_megabyte_line_is_capped():
    events = classify("vllm", "INFO 05-12 02:45:15 args: " + "x" * 1_000_000)
    assert len(events) == 1
    assert len(events[0].text) <= MAX_LINE_CHARS


def test_blank_lines_make_no_events():
    assert classify("vllm", "", "   ", "\r\n", "\x1b[0m") == []


# --- timestamps -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "line", "expected"),
    [
        ("sglang", "[2026-08-01 23:37:50] Load weight begin.", local(2026, 8, 1, 23, 37, 50)),
        ("sglang", "[2026-02-26 16:31:00 TP7] Load weight begin.", local(2026, 2, 26, 16, 31)),
        (
            "tgi",
            "2023-08-17T15:28:43.904106Z  INFO shard-manager: text_generation_launcher: x",
            datetime(2023, 8, 17, 15, 28, 43, 904106, tzinfo=UTC).timestamp(),
        ),
        (
            "tgi",
            "2024-04-18T18:44:03.144-04:00   #033[2m2024-04-18T22:43:58.111453Z#033[0m INFO",
            datetime(2024, 4, 18, 22, 44, 3, 144000, tzinfo=UTC).timestamp(),
        ),
        ("trtllm", "[12/20/2025-04:20:04] [TRT-LLM] [I] Using LLM", local(2025, 12, 20, 4, 20, 4)),
        ("vllm", "INFO 02-12 02:45:31 [gpu_model_runner.py:1329] x", local(2026, 2, 12, 2, 45, 31)),
        (
            "triton",
            "I0220 12:34:56.123456 1 server.cc:1] x",
            local(2026, 2, 20, 12, 34, 56, 123456),
        ),
    ],
)
def test_timestamps_are_read_in_each_engine_format(engine, line, expected):
    (event,) = classify(engine, line)
    assert event.at == pytest.approx(expected)


def test_a_yearless_vllm_stamp_takes_the_year_printed_earlier():
    # vllm-05-ready: TensorFlow prints a full date before vLLM's "INFO 10-14 ..." lines.
    events = classify(
        "vllm",
        "2025-10-14 19:22:02.853794: I tensorflow/core/util/port.cc:153] oneDNN custom ops",
        "INFO 10-14 19:22:45 [core.py:77] Initializing a V1 LLM engine (v0.11.0)",
    )
    assert events[1].at == local(2025, 10, 14, 19, 22, 45)


def test_a_december_stamp_read_in_january_belongs_to_last_year():
    c = LogClassifier(ENGINES["vllm"].log)
    (event,) = c.classify("INFO 12-31 23:59:00 [core.py:1] x", at=local(2026, 1, 1, 0, 5))
    assert event.at == local(2025, 12, 31, 23, 59)


def test_stamps_across_a_daylight_saving_change_keep_each_minutes_offset():
    # Offsets are looked up once a minute: lines in one minute share it, the next may not.
    berlin = ZoneInfo("Europe/Berlin")  # clocks went back at 03:00 CEST on 2025-10-26
    c = LogClassifier(ENGINES["sglang"].log, tz=berlin)
    stamps = [
        "2025-10-26 01:59:59",
        "2025-10-26 02:30:15",
        "2025-10-26 03:00:00",
        "2025-03-30 02:30:00",
    ]
    read = [c.classify(f"[{s}] Load weight begin.", at=AT)[0].at for s in stamps]
    expected = [datetime.fromisoformat(s).replace(tzinfo=berlin).timestamp() for s in stamps]
    assert read == expected
    assert read[2] - read[0] == 7201  # 02:00-03:00 came twice (CEST, then CET)


def test_one_stamp_is_read_in_each_zone_and_year_it_is_given_in():
    # Stamps are remembered by their text: the same text in another zone, or a yearless one
    # in another year, is another time.
    line = "INFO 03-01 11:00:00 [core.py:1] Initializing a V1 LLM engine"
    berlin, tokyo = ZoneInfo("Europe/Berlin"), ZoneInfo("Asia/Tokyo")
    read = [
        LogClassifier(ENGINES["vllm"].log, tz=tz).classify(line, at=at)[0].at
        for tz, at in ((berlin, AT), (tokyo, AT), (berlin, local(2025, 3, 1)), (berlin, AT))
    ]
    assert read[0] - read[1] == 8 * 3600
    assert read[0] - read[2] == 365 * 86400
    assert read[3] == read[0] == datetime(2026, 3, 1, 11, tzinfo=berlin).timestamp()


def test_a_stamp_shared_by_thousands_of_lines_reads_the_same_on_each():
    # More stamps than are remembered: the oldest are forgotten and each still reads right.
    c = LogClassifier(ENGINES["sglang"].log)
    stamps = [
        f"2026-08-01 {h:02d}:{m:02d}:{s:02d}" for h in (1, 2) for m in range(60) for s in range(60)
    ]
    lines = [f"[{s}] Load weight begin." for s in stamps]
    read = [c.classify(line, at=AT)[0].at for line in (*lines, *lines[:3])]
    assert read == [datetime.fromisoformat(s).timestamp() for s in (*stamps, *stamps[:3])]


def test_glog_lines_without_a_date_keep_the_read_time():
    # vllm-05-ready: "E0000 00:00:1760469722.892123" is not a date.
    (event,) = classify("vllm", "E0000 00:00:1760469722.892123    4394 cuda_dnn.cc:8579] x")
    assert event.at == AT


def test_the_line_timestamp_can_be_ignored_for_journald():
    c = LogClassifier(ENGINES["sglang"].log)
    (event,) = c.classify("[2026-08-01 23:37:50] Load weight begin.", at=AT, line_time=False)
    assert event.at == AT
    assert c.last_timestamp is None


# --- classes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "CUTE_DSL - WARNING - [handle_import_error] - Unexpected error during package walk: "
        "cutlass.cute.experimental",
        "[Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected peer ranks: 7",
        "[2026-02-26 16:31:00 TP2] Ignore import error when loading sglang.srt.models.glm_ocr: x",
        "`torch_dtype` is deprecated! Use `dtype` instead!",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        "[rank0]:[W1010 ProcessGroupNCCL.cpp:1538] WARNING: destroy_process_group() was not "
        "called before program exit, which can leak resources.",
        "2023-08-17T15:28:43Z  INFO shard-manager: text_generation_launcher: Waiting for shard "
        "to be ready... rank=0",
    ],
)
def test_known_noise_is_benign(line):
    engine = "tgi" if "shard-manager" in line else "sglang"
    (event,) = classify(engine, line)
    assert event.cls is LogClass.BENIGN


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
        ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 12.00 GiB.", "oom"),
        ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)", "nccl"),
        (
            "[E ProcessGroupNCCL.cpp:828] [Rank 0] Watchdog caught collective operation timeout",
            "nccl",
        ),
        ("RuntimeError: NCCL error: unhandled cuda error (CUDA out of memory)", "oom"),
        ("systemd[1]: vllm.service: Failed with result 'oom-kill'.", "oom"),
        ("CUDA error: an illegal memory access was encountered", "crash"),
    ],
)
def test_fatal_lines_carry_their_reason(line, reason):
    (event,) = classify("vllm", line)
    assert event.cls is LogClass.FATAL
    assert event.fatal_reason == reason


def test_levels_without_a_pattern_become_error_warning_or_info():
    events = classify(
        "vllm",
        "ERROR 05-12 02:47:14 [serving_chat.py:136] Error with model object='error'",
        "WARNING 05-12 02:45:30 [utils.py:2522] Methods not implemented",
        "INFO 05-12 02:45:23 [config.py:2003] Chunked prefill is enabled",
    )
    assert [e.cls for e in events] == [LogClass.ERROR, LogClass.WARNING, LogClass.INFO]


def test_the_cause_at_the_end_of_a_scheduler_traceback_is_the_failure():
    # sglang-01-crash: the wrapper line comes first, the exception that killed the rank last.
    events = classify(
        "sglang",
        "[2026-02-26 16:41:24 TP6] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 3096, in run',
        "    scheduler = Scheduler(",
        "TypeError: cannot unpack non-iterable ForwardMetadata object",
    )
    assert [e.cls for e in events] == [LogClass.ERROR] * 3 + [LogClass.FATAL]
    assert events[-1].fatal_reason is FailureReason.CRASH


def test_an_oom_inside_a_scheduler_traceback_is_an_oom_not_a_crash():
    # sglang-03-oom: "Scheduler hit an exception" precedes "torch.OutOfMemoryError: HIP ...".
    events = classify(
        "sglang",
        "[2026-02-26 06:25:15 TP3] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.10/site-packages/torch/utils/_device.py", line 103, in f',
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 12.00 GiB.",
    )
    fatal = [e for e in events if e.cls is LogClass.FATAL]
    assert [e.fatal_reason for e in fatal] == [FailureReason.OOM]


def test_a_traceback_without_a_wrapper_is_an_error_not_a_failure():
    # A request handler's traceback after ready must not fail the server.
    events = classify(
        "sglang",
        "Traceback (most recent call last):",
        '  File "/x/serving_chat.py", line 1185, in handle',
        "ValueError: bad request",
    )
    assert [e.cls for e in events] == [LogClass.ERROR] * 3


def test_keyboard_interrupt_ends_a_traceback_without_failing():
    events = classify(
        "vllm",
        "(EngineCore_DP0 pid=1) EngineCore failed to start.",
        "Traceback (most recent call last):",
        "KeyboardInterrupt: terminated",
    )
    assert LogClass.FATAL not in {e.cls for e in events}


# --- markers and progress -------------------------------------------------------------------


def test_a_draft_models_second_load_has_its_own_progress_key():
    # sglang-05-ready: the DFlash draft loads after the target with a 0/1 shard bar.
    events = classify(
        "sglang",
        "[2026-08-01 23:37:50] Load weight begin. avail mem=115.36 GB",
        "\rMulti-thread loading shards: 100% Completed | 15/15 [01:41<00:00,  6.74s/it]",
        "[2026-08-01 23:39:39] Load weight end. elapsed=109.33 s",
        "[2026-08-01 23:39:43] Load weight begin. avail mem=47.83 GB",
        "\rMulti-thread loading shards:   0% Completed | 0/1 [00:00<?, ?it/s]",
    )
    bars = [(e.progress_key, e.progress) for e in events if e.progress]
    assert bars == [("shards", (15, 15)), ("draft:shards", (0, 1))]


def test_a_relaunched_engine_loads_its_main_model_again():
    load = (
        "[2026-08-01 23:37:50] Load weight begin. avail mem=115.36 GB",
        "Loading safetensors checkpoint shards:  50% Completed | 7/14 [00:03<00:04]",
        "[2026-08-01 23:39:39] Load weight end. elapsed=109.33 s",
    )
    relaunch = "[2026-08-02 08:00:00] server_args=ServerArgs(model_path='m', tp_size=1)"
    events = classify("sglang", *load, relaunch, *load)
    assert [e.progress_key for e in events if e.progress] == ["shards", "shards"]


def test_tensor_parallel_ranks_loading_together_share_the_main_key():
    lines = [f"[2025-03-08 12:29:13 TP{r}] Load weight begin. avail mem=21.63 GB" for r in range(4)]
    lines.append("Loading safetensors checkpoint shards:  50% Completed | 7/14 [00:03<00:04]")
    lines += [f"[2025-03-08 12:29:21 TP{r}] Load weight end. type=Qwen2" for r in range(4)]
    events = classify("sglang", *lines)
    assert [e.progress_key for e in events if e.progress] == ["shards"]


def test_wording_drift_between_versions_is_tolerated():
    # ENGINES.md gotcha 3: takes->took, API server->server, cuda graph->target decode CUDA graph.
    events = classify(
        "vllm",
        "INFO 05-12 02:45:58 [monitor.py:33] torch.compile takes 11.47 s in total",
        "INFO 01-23 15:50:01 [monitor.py:40] torch.compile took 13.01 s in total",
        "INFO 05-12 02:46:33 [api_server.py:1090] Starting vLLM API server on http://0.0.0.0:8000",
        "INFO 01-23 15:52:10 [api_server.py:1300] Starting vLLM server on http://0.0.0.0:8000",
    )
    assert [e.marker for e in events] == ["compile", "compile", "http_up", "http_up"]
    sglang = classify(
        "sglang",
        "[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
        "[2026-01-01 00:00:00 TP0] Capture target decode CUDA graph begin. avail mem=5 GB",
    )
    assert [e.marker for e in sglang] == ["cuda_graph", "cuda_graph"]


# --- user patterns --------------------------------------------------------------------------


def test_user_patterns_extend_and_override_the_profile():
    patterns = LogPatterns(
        benign=(UserRegex(r"CUDA out of memory in the test harness", ignore_case=True),),
        fatal=(UserRegex(r"my engine gave up", ignore_case=True),),
        markers=(UserRegex(r"custom warmup finished", ignore_case=True),),
    )
    events = classify(
        "vllm",
        "CUDA out of memory in the test harness (expected)",
        "my engine gave up: out of memory",
        "custom warmup finished",
        patterns=patterns,
    )
    assert [e.cls for e in events] == [LogClass.BENIGN, LogClass.FATAL, LogClass.MARKER]
    assert events[1].fatal_reason is FailureReason.OOM
    assert events[2].marker == "user"


def test_an_operators_pattern_decides_a_line_the_profile_reads_as_a_marker():
    # Checked before the profile's layers even where the screen finds none of theirs.
    patterns = LogPatterns(
        fatal=(UserRegex(r"capture cuda graph begin", ignore_case=True),),
        benign=(UserRegex(r"load weight begin", ignore_case=True),),
    )
    events = classify(
        "sglang",
        "[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=78.5 GB",
        "[2026-01-01 00:00:09 TP0] Capture cuda graph begin. This can take up to several minutes.",
        patterns=patterns,
    )
    assert [(e.cls, e.marker) for e in events] == [(LogClass.BENIGN, None), (LogClass.FATAL, None)]


# --- secrets --------------------------------------------------------------------------------

SECRET_LINES = [
    "INFO 08-01 18:02:54 [api_utils.py:273] non-default args: {'api_key': 'sk-CANARY0'}",
    "vllm serve m --api-key sk-CANARY1 --port 8000",
    "vllm serve m --api-key=CANARY2 --port 8000",
    "Environment: VLLM_API_KEY=CANARY3 HF_TOKEN=hf_CANARY4abcdefghijklmnopqrstuvwx",
    "args: Namespace(api_key=['CANARY5', 'CANARY6'], port=8000)",
    'request headers {"Authorization": "Bearer CANARY7tokenvalue"}',
    "curl -H 'Authorization: Bearer CANARY8tokenvalue' http://127.0.0.1:8000/health",
    "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m', api_key='sk-CANARY9')",
    'json {"api_key":"CANARY10","hf_token": "CANARY11"}',
]


@pytest.mark.parametrize("line", SECRET_LINES)
def test_secrets_never_leave_the_classifier(line):
    for engine in ENGINES:
        for event in classify(engine, line):
            assert "CANARY" not in event.text
            assert "<redacted>" in event.text


def test_a_redacted_line_still_announces_its_phase():
    # RELIABILITY E55: the phase is parsed, the secret is not shown.
    (event,) = classify("sglang", SECRET_LINES[-2])
    assert event.marker == "server_args"


@pytest.mark.parametrize(
    "line",
    [
        "[2026-08-02 00:07:42] Decode batch, #running-req: 1, #full token: 16978, #swa token: 1069",
        "INFO 05-12 02:45:15 args: Namespace(max_tokens=4, api_key=None, tokenizer='t')",
        "Please set a HF_TOKEN to enable higher rate limits",
        "skip_tokenizer_init=False, hf_config.architectures=['LagunaForCausalLM']",
    ],
)
def test_ordinary_text_is_not_mistaken_for_a_secret(line):
    assert redact(line).replace("api_key=<redacted>", "api_key=None") == line


# Issue 19 #10: one line per shape that reached /status and wait's last lines before.
SECRET_SHAPES = {
    "key=value naming a secret": "request failed auth_token=CANARYa1 model=m",
    "query token in a logged URL": "GET http://10.0.0.1:8000/v1/models?token=CANARYq&limit=5 401",
    "URL credentials": "fetching https://user:CANARYpw@huggingface.co/m/resolve/main/a.bin",
    "AWS secret in the environment": "env: AWS_SECRET_ACCESS_KEY=CANARYaws AWS_REGION=us-east-1",
    "AWS access key id": "boto: using key AKIAIOSFODNN7EXAMPLE for s3",
    "key: value": "password: CANARYyaml",
    "JSON pair": 'config {"client_secret": "CANARYjson", "model": "m"}',
    "camelCase key": "login apiKey=CANARYcamel sessionToken: CANARYst",
    "header with a dash": "x-api-key: CANARYhdr",
    "cookie header": "Cookie: session=CANARYc; other=CANARYd",
    "raw authorization": "Authorization: CANARYraw",
    "flag before another flag": "serve --hf-token CANARYflag --port 8000",
    "Google API key in a query": "https://www.googleapis.com/x?key=CANARYgoogle&alt=json",
    "presigned URL": "GET /b/o?X-Amz-Credential=CANARYcred/2023&X-Amz-Signature=CANARYsig",
    "GitHub token": "clone with ghp_CANARY0123456789abcdefghij",
    "GitHub fine-grained token": "token github_pat_11CANARY0123456789abcdefghij",
    "Slack token": "posting with xoxb-CANARY012345-abcdef",
    "JWT": "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJDQU5BUlkifQ.CANARYsignature",
    "PEM private key": "-----BEGIN RSA PRIVATE KEY----- MIIECANARY",
    # Issue 30 #16: a qualifier after the secret's name, a bare key, a spaced environment
    # variable, percent-encoded userinfo (in a URL inside a query, and alone).
    "a secret's id": 'sa {"private_key_id": "CANARYkid0123", "type": "service_account"}',
    "a secret's value": "vault client_secret_value=CANARYval model=m",
    "bare key": "client config key=CANARYbare model=m",
    "environment variable, space, value": "env WANDB_API_KEY 3f9aCANARY0123456789abcdef",
    "encoded URL credentials": "GET /login?next=https%3A%2F%2Fuser%3ACANARYpw%40hf.co%2Fm 302",
    "encoded userinfo alone": "clone from user%3ACANARYpw%40github.com/org/repo",
}


@pytest.mark.parametrize("line", SECRET_SHAPES.values(), ids=SECRET_SHAPES.keys())
def test_each_secret_shape_is_redacted(line):
    redacted = redact(line)
    assert "CANARY" not in redacted and "EXAMPLE" not in redacted
    assert "<redacted>" in redacted
    assert redacted[:5] == line[:5], "what comes before the secret still reads"


@pytest.mark.parametrize(
    "line",
    [
        "loading /models/meta-llama/Llama-3.1-8B-Instruct/tokenizer.json",
        "Namespace(max_tokens=2048, tokenizer='t', tokenizer_mode=auto, skip_tokenizer_init=False)",
        "Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 40.1 token/s",
        "time to first token: 35ms, token_count=12, max_num_batched_tokens=8192",
        "print_info: BOS token        = 128000 '<|begin_of_text|>'",
        "allow_credentials=False, api_key_file=/etc/exporter/key, session_len=4096",
        "model Qwen/Qwen2.5-7B-Instruct@main on cuda:0, author: someone, oauth_enabled=false",
        "mail ops@example.com about http://127.0.0.1:8000/health?ready=1",
        "disk-cache at /var/cache/sk-models, task-1234 done",
        "HF_TOKEN environment variable is not set, VLLM_API_KEY 2 set",
        "cache_key=abc123 sort_key=1 monkey=9, dispatch key: ADInplaceOrView, mask_token_id=12",
        "mail ops%40example.com, GET /v1%2Fmodels%40main",
    ],
)
def test_ordinary_lines_are_left_as_they_are(line):
    assert redact(line) == line


def test_a_long_launch_line_loses_every_secret_and_keeps_its_settings():
    # SGLang prints its ServerArgs as one line of 10 kB: the pairs are looked for only where
    # a key holding a secret's word starts, so each must still be found, first to last.
    settings = [f"setting_{i}={i}" for i in range(400)]
    settings[0] = "api_key='CANARY0 with a space'"
    settings[150] = "hf_token=hf_CANARY1abcdefghijklmnop"
    settings[399] = '"client_secret": "CANARY2"'
    settings[200] = "max_total_tokens=8192, skip_tokenizer_init=False, admin_api_key=None"
    line = "[2026-01-01 00:00:00] server_args=ServerArgs(" + ", ".join(settings) + ")"
    assert len(line) > 5000
    redacted = redact(line)
    assert "CANARY" not in redacted
    assert redacted.count("<redacted>") == 3
    assert "max_total_tokens=8192, skip_tokenizer_init=False, admin_api_key=None" in redacted
    assert "setting_398=398" in redacted


def test_a_quoted_secret_holding_a_pair_is_hidden_once_and_whole():
    line = "args: api_key='a session_token=b', hf_token=\"hf_abcdefghijklmnopqr token=c\" port=1"
    expected = "args: api_key='<redacted>', hf_token=\"<redacted>\" port=1"
    assert redact(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        # The longest key the pair shape takes: 64 characters before "private_key".
        "c" * 63 + "_private_key=CANARY",
        # Words outside ASCII around the key: case folding may move positions.
        "paramètres: clé=ß api_key='CANARY' modèle=m",
        "\u017fervice sessIon_token: CANARY",
    ],
)
def test_a_key_is_found_at_the_edge_of_its_reach_and_among_other_scripts(line):
    assert "CANARY" not in redact(line)


# --- fast weight loaders (ENGINES.md section 8) -------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang", "openai"])
@pytest.mark.parametrize(
    ("line", "loader", "progress", "gib_per_second"),
    [
        (
            "INFO 12-01 10:00:00 [weight_utils.py:1] Loading safetensors using Runai Model "
            "Streamer: 43% Completed | 3/7 [00:05<00:06,  1.21it/s]",
            "runai-streamer",
            (3, 7),
            None,
        ),
        (
            "INFO 12-01 10:00:09 [runai.py:1] [RunAI Streamer] Overall time to stream 34.3 GiB "
            "of all files to cpu: 28.52s, 1.2 GiB/s",
            "runai-streamer",
            None,
            1.2,
        ),
        (
            "INFO 12-01 10:00:09 [tensorizer.py:1] Deserialized 15.0 GiB in 5.00s, 3.0 GiB/s",
            "tensorizer",
            None,
            3.0,
        ),
        (
            "[2026-12-01 10:00:00] Loading safetensors using Fastsafetensor loader: 50% "
            "Completed | 2/4 [00:01<00:01]",
            "fastsafetensors",
            (2, 4),
            None,
        ),
        (
            "Loading safetensors using InstantTensor loader: 9% Completed | 13.3G/155G",
            "instanttensor",
            (13_300_000_000, 155_000_000_000),
            None,
        ),
    ],
)
def test_fast_loader_lines_name_the_loader_and_count_as_loading(
    engine, line, loader, progress, gib_per_second
):
    (event,) = classify(engine, line)
    assert event.loader == loader
    assert event.cls in (LogClass.PROGRESS, LogClass.INFO)  # evidence, never an alarm
    if progress is not None:
        assert (event.progress, event.phase) == (progress, Phase.LOADING)
    if gib_per_second is None:
        assert event.loader_bytes_per_second is None
    else:
        assert event.loader_bytes_per_second == pytest.approx(gib_per_second * 2**30)


def test_a_summary_without_a_rate_is_size_over_seconds_in_the_units_it_wrote():
    (event,) = classify("vllm", "Deserialized 12 GB in 4s")
    assert event.loader == "tensorizer"
    assert event.loader_bytes_per_second == pytest.approx(3e9)


def test_lines_that_name_no_loader_get_none():
    (event,) = classify(
        "vllm", "INFO 12-01 10:00:09 [default_loader.py:1] Loading weights took 3.83 seconds"
    )
    assert event.loader is None and event.loader_bytes_per_second is None


@pytest.mark.parametrize(
    "line",
    [
        "\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO 02-05 00:05:28 [api_server.py:1354] vLLM API",
        "#033[2m2025-04-14T15:51:31.134585Z#033[0m #033[32m INFO#033[0m router: listening",
        "llama_model_loader: Dumping metadata keys/values. Note: KV overrides do not apply.",
        "INFO 02-05 00:05:28 [config.py:12] stderr is redirected",
    ],
)
def test_an_info_line_with_colour_codes_or_a_word_like_a_level_is_only_counted(line):
    classifier = LogClassifier(ENGINES["vllm"].log)
    assert classifier.plain(line) is LogClass.INFO
    assert [e.cls for e in classifier.classify(line, at=0.0)] == [LogClass.INFO]


@pytest.mark.parametrize(
    "line",
    [
        "\x1b[33mWARNING 02-05 00:05:28 [config.py:12] overriding the chat template\x1b[0m",
        "\x1b[31mERROR\x1b[0m could not reach the model store",
        "Traceback (most recent call last):",
        "llama_model_loader: ERROR reading the header of model.gguf",
    ],
)
def test_a_warning_error_or_traceback_is_classified_even_in_colour(line):
    classifier = LogClassifier(ENGINES["vllm"].log)
    assert classifier.plain(line) is None
    assert classifier.classify(line, at=0.0)[0].cls is not LogClass.INFO


def test_a_line_plain_left_to_classify_decides_nothing_for_the_next_line():
    # ``plain`` remembers its scan and its verdict for ``classify`` to go on from: only for
    # the very line it looked at.
    c = LogClassifier(ENGINES["vllm"].log)
    marker = "INFO 02-05 00:05:20 [core.py:77] Initializing a V1 LLM engine (v0.11.0)"
    request = 'INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK'
    counts: Counter[LogClass] = Counter()
    assert c.plain(marker) is None
    assert c.classify(request, at=AT, counts=counts) == []
    assert counts == Counter({LogClass.BENIGN: 1})
    assert [e.marker for e in c.classify(marker, at=AT, counts=counts)] == ["engine_init"]
