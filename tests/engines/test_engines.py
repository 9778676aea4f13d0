"""Engine profiles are data: complete, sourced, and saying what ENGINES.md says they say."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from exporter.base.model import FailureReason, LogClass, Phase
from exporter.core.classify import LogClassifier
from exporter.engines import ENGINES, access, vocabulary

ENGINE_DIR = Path(__file__).resolve().parents[2] / "exporter" / "engines"
_CALL = re.compile(r"^\s*(marker|progress|fatal|benign|wrapper)\(")
_SECTION = re.compile(r"^\s*(markers|fatal|benign|wrappers|detect)=")
#: A fixture, a shared document, an issue, or the engine's own source file or doc page.
_CITATION = re.compile(
    r"[a-z]+-\d\d\b|ENGINES\.md|issue \d+|DESIGN\.md|README\.md"
    r"|\b[\w/.-]+\.(?:py|rs|go|cc|cpp|h|md|rst)\b|\bdocs?\b"
)


def one(engine: str, line: str):
    (event,) = LogClassifier(ENGINES[engine].log).classify(line, at=0.0)
    return event


def test_every_engine_has_a_profile_attached():
    for name, engine in ENGINES.items():
        module = importlib.import_module(f"exporter.engines.{name}")
        assert engine.log is module.LOG_PROFILE
        # Noise shared by every engine lives in the vocabulary: a profile may add none.
        assert engine.log.markers and engine.log.fatal, name


def test_progress_patterns_name_done_and_total():
    for engine in ENGINES.values():
        for p in engine.log.markers:
            if p.cls is LogClass.PROGRESS:
                assert {"done", "total"} <= set(p.regex.groupindex), p.regex.pattern
            assert p.regex.flags & re.IGNORECASE


@pytest.mark.parametrize("path", sorted(ENGINE_DIR.glob("*.py")), ids=lambda p: p.name)
def test_every_pattern_cites_its_source(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not _CALL.match(line) or "def " in line:
            continue
        j = i - 1
        while j >= 0 and not lines[j].lstrip().startswith("#") and not _SECTION.match(lines[j]):
            j -= 1
        block = []
        while j >= 0 and lines[j].lstrip().startswith("#"):
            block.append(lines[j])
            j -= 1
        assert _CITATION.search(" ".join(block)), f"{path.name}:{i + 1}: pattern without a source"


@pytest.mark.parametrize(
    ("engine", "line", "cls", "phase"),
    [
        # vLLM passes uvicorn a pre-bound socket: startup complete is the ready line.
        ("vllm", "(APIServer pid=1) INFO:     Application startup complete.", "marker", "ready"),
        # SGLang runs a warm-up request after uvicorn starts: not ready yet.
        (
            "sglang",
            "[2026-01-01 00:00:00] INFO:     Application startup complete.",
            "marker",
            "initializing",
        ),
        (
            "sglang",
            "[2026-01-01 00:00:00] The server is fired up and ready to roll!",
            "marker",
            "ready",
        ),
        # llama.cpp listens before it loads; only the main loop line means ready.
        (
            "llamacpp",
            "main: HTTP server is listening, hostname: 0.0.0.0, port: 8080",
            "marker",
            None,
        ),
        (
            "llamacpp",
            "main: server is listening on http://0.0.0.0:8080 - starting the main loop",
            "marker",
            "ready",
        ),
        (
            "tgi",
            "2024-01-01T00:00:00Z  INFO text_generation_router: router/src/main.rs:1: Connected",
            "marker",
            "ready",
        ),
        (
            "tgi",
            "2024-01-01T00:00:00Z  INFO text_generation_launcher: Starting shard rank=0",
            "marker",
            "loading",
        ),
        (
            "triton",
            "I0101 00:00:00.000000 1 grpc_server.cc:1] Started GRPCInferenceService at :8001",
            "marker",
            "ready",
        ),
        (
            "triton",
            "I0101 00:00:00.000000 1 model_lifecycle.cc:1] loading: llama:1",
            "marker",
            "loading",
        ),
        (
            "trtllm",
            "INFO:     Uvicorn running on http://0.0.0.0:8355 (Press CTRL+C to quit)",
            "marker",
            "ready",
        ),
        # Issue 13: an unknown engine still recognises the common ready lines.
        ("openai", "INFO:     Application startup complete.", "marker", "ready"),
        # Ollama serves its API before any model is loaded: not ready yet.
        (
            "ollama",
            "time=2026-02-14T04:08:24.503+09:00 level=INFO source=routes.go:1689 "
            'msg="Listening on 127.0.0.1:11434 (version 0.16.1)"',
            "marker",
            None,
        ),
        (
            "ollama",
            "time=2026-02-14T04:12:20.778+09:00 level=INFO source=server.go:1388 "
            'msg="llama runner started in 9.88 seconds"',
            "marker",
            "ready",
        ),
    ],
)
def test_markers_announce_the_phase_engines_md_gives(engine, line, cls, phase):
    event = one(engine, line)
    assert (event.cls, event.phase) == (LogClass(cls), None if phase is None else Phase(phase))


@pytest.mark.parametrize(
    ("engine", "line", "reason"),
    [
        ("vllm", "ValueError: No available memory for the cache blocks. Try increasing", "oom"),
        ("vllm", "RuntimeError: Engine core initialization failed. See root cause above.", "crash"),
        ("sglang", "[2026-01-01 00:00:00] Rank 0 scheduler is dead. Please check logs.", "crash"),
        ("sglang", "[2026-01-01 00:00:00] Initialization failed. warmup error: boom", "crash"),
        (
            "tgi",
            "2023-08-17T10:23:27Z ERROR text_generation_launcher: Shard 0 failed to start",
            "crash",
        ),
        ("llamacpp", "main: exiting due to model loading error", "crash"),
        ("llamacpp", "alloc_tensor_range: failed to allocate CUDA0 buffer of size 1", "oom"),
        (
            "triton",
            "E0101 00:00:00.000000 1 model_lifecycle.cc:1] failed to load 'm' version 1",
            "crash",
        ),
        (
            "trtllm",
            "[04/30/2025-14:03:32] [TRT-LLM] [E] Failed to initialize executor on rank 6",
            "crash",
        ),
    ],
)
def test_engine_specific_failures_are_fatal(engine, line, reason):
    event = one(engine, line)
    assert (event.cls, event.fatal_reason) == (LogClass.FATAL, FailureReason(reason))


@pytest.mark.parametrize(
    ("engine", "line"),
    [
        (
            "vllm",
            "WARNING 01-01 00:00:00 [shm_broadcast.py:1] No available shared memory broadcast "
            "block found in 60 seconds.",
        ),
        (
            "tgi",
            "2023-08-17T15:28:43Z  INFO shard-manager: text_generation_launcher: Waiting for "
            "shard to be ready... rank=0",
        ),
        (
            "sglang",
            "[2026-08-02 00:17:43] Subprocess detokenizer (pid=31379) crashed with exit "
            "code -15. Triggering SIGQUIT for cleanup...",
        ),
    ],
)
def test_heartbeats_and_stop_noise_are_benign(engine, line):
    # Printed whether or not the engine progresses, or on a normal stop: never evidence.
    assert one(engine, line).cls is LogClass.BENIGN


def test_every_pattern_compiles_as_re2():
    # The classifier screens lines with an RE2 set: no backreferences, no lookaround.
    re2 = pytest.importorskip("re2")
    profiles = [e.log for e in ENGINES.values()]
    patterns = [
        p.regex.pattern
        for prof in profiles
        for p in (*prof.markers, *prof.fatal, *prof.benign, *prof.wrappers)
    ]
    patterns += [d.pattern for prof in profiles for d in prof.detect]
    patterns += [
        p.regex.pattern
        for p in (
            *vocabulary.FATAL,
            *vocabulary.MARKERS,
            *vocabulary.WRAPPERS,
            *vocabulary.BENIGN,
            *vocabulary.STOPS,
            *access.ACCESS,
        )
    ]
    patterns += [regex.pattern for regex, _ in vocabulary.LOADERS]
    for pattern in patterns:
        re2.compile(pattern)


@pytest.mark.parametrize(
    "line",
    [
        'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        '[2026-08-01 23:40:01] INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK',
        '[GIN] 2024/05/01 - 12:00:00 | 200 |    1.234ms |  127.0.0.1 | POST     "/api/chat"',
        "srv  log_server_r: request: POST /completion 127.0.0.1 200",
    ],
)
def test_request_access_lines_are_known_traffic_on_every_engine(line):
    for engine in ENGINES.values():
        classifier = LogClassifier(engine.log)
        assert classifier.plain(line) is LogClass.BENIGN, engine.name
        (event,) = classifier.classify(line, at=0.0)
        assert event.cls is LogClass.BENIGN and event.phase is None, engine.name
