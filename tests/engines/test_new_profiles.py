"""Profiles written from engines' own source and docs (issue 33): what they announce, and that
their detection cannot steal any corpus log from the engine it belongs to."""

from __future__ import annotations

import pytest

from exporter.base.model import FailureReason, LogClass, Phase
from exporter.commands.replay_log import detect_engine, read_lines
from exporter.core.classify import LogClassifier, clean
from exporter.engines import ENGINES
from tests import corpus

NEW = ("tei", "koboldcpp")


def one(engine: str, line: str):
    (event,) = LogClassifier(ENGINES[engine].log).classify(line, at=0.0)
    return event


@pytest.mark.parametrize(
    ("engine", "line", "phase"),
    [
        (
            "tei",
            "2025-01-04T20:38:18.706787Z  INFO text_embeddings_backend_candle: "
            "backends/candle/src/lib.rs:292: Starting FlashBert model on Cuda(CudaDevice(1))",
            "loading",
        ),
        (
            "tei",
            "2025-01-04T20:38:31Z  INFO text_embeddings_router: router/src/lib.rs:248: "
            "Warming up model",
            "initializing",
        ),
        (
            "tei",
            "2025-01-04T20:38:32Z  INFO text_embeddings_router::http::server: "
            "router/src/http/server.rs:1813: Ready",
            "ready",
        ),
        ("koboldcpp", "Load Text Model OK: True", "initializing"),
        (
            "koboldcpp",
            "Starting Kobold API on port 5001 at http://localhost:5001/api/",
            "initializing",
        ),
        ("koboldcpp", "Please connect to custom endpoint at http://localhost:5001", "ready"),
    ],
)
def test_markers_announce_their_phase(engine, line, phase):
    event = one(engine, line)
    assert event.cls is LogClass.MARKER
    assert event.phase == (None if phase is None else Phase(phase))


@pytest.mark.parametrize(
    ("engine", "line"),
    [
        ("tei", "Error: Could not create backend"),
        ("koboldcpp", "Load Text Model OK: False"),
        ("koboldcpp", "llama_model_load: error loading model: failed to open model.gguf"),
    ],
)
def test_their_failures_are_fatal(engine, line):
    event = one(engine, line)
    assert (event.cls, event.fatal_reason) == (LogClass.FATAL, FailureReason.CRASH)


def test_a_koboldcpp_log_with_llamacpp_loader_lines_is_koboldcpp():
    lines = [
        "Welcome to KoboldCpp - Version 1.80",
        "llama_model_load: loaded meta data with 26 key-value pairs",
        "load_tensors: offloaded 33/33 layers to GPU",
        "Please connect to custom endpoint at http://localhost:5001",
    ]
    assert detect_engine(lines) == "koboldcpp"


def test_no_corpus_log_is_taken_by_a_new_profile():
    logs = corpus.require()
    for path in sorted(logs.glob("*.log")):
        lines = [clean(text) for _, text in read_lines(path)]
        for name in NEW:
            hits = [t for t in lines if any(d.search(t) for d in ENGINES[name].log.detect)]
            assert hits == [], (path.name, name, hits[:2])
        assert detect_engine(lines) != "koboldcpp"
