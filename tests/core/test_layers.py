"""A profile's layers and piece screen: made once, and each question at the index it claims."""

from __future__ import annotations

from exporter.config import UserRegex
from exporter.core.classify import LogClassifier
from exporter.core.layers import Layers, layers_of
from exporter.engines import ENGINES
from exporter.engines.profile import LogPatterns


def _hits(layers: Layers, text: str) -> set[int]:
    assert layers.scan is not None
    return set(layers.scan(text.encode()) or ())


def test_classifiers_of_one_profile_share_its_screens() -> None:
    profile = ENGINES["vllm"].log
    assert layers_of(profile) is layers_of(profile)
    first, second = LogClassifier(profile), LogClassifier(profile)
    assert first.block is not None and first.block is second.block
    assert LogClassifier(ENGINES["sglang"].log).block is not first.block


def test_operator_patterns_turn_the_block_screen_off() -> None:
    # Operator patterns are searched line by line: a block of lines skipped unread would
    # skip the lines they name.
    patterns = LogPatterns(fatal=(UserRegex("my engine died", ignore_case=True),))
    assert LogClassifier(ENGINES["vllm"].log, patterns).block is None


def test_each_question_of_a_piece_is_read_at_its_own_indices() -> None:
    layers = layers_of(ENGINES["vllm"].log)
    stamps = range(layers.stamps_at, layers.redact_at)
    assert _hits(layers, "[2026-02-09 14:38:13] nothing else") & set(stamps)
    assert not _hits(layers, "nothing at all here") & set(stamps)
    assert _hits(layers, "worker WARNING slow") & layers.level_extras
    assert _hits(layers, "Loading safetensors using Fastsafetensor loader") & layers.loader_hits
    assert layers.hint_at in _hits(layers, "CUDA out of memory")
    assert max(_hits(layers, "url https://user:hunter2@example.com/x")) >= layers.redact_at


def test_a_profile_fatal_line_hits_the_fatal_layer_first() -> None:
    layers = layers_of(ENGINES["vllm"].log)
    fatal = layers.offsets[id(layers.fatal)]
    hits = _hits(layers, "ValueError: No available memory for the cache blocks. Try increasing")
    inside = [i for i in hits if fatal <= i < fatal + len(layers.fatal.patterns)]
    assert inside and all(layers.layer_of[i] == id(layers.fatal) for i in inside)
    assert (
        LogClassifier(ENGINES["vllm"].log)
        .classify("ValueError: No available memory for the cache blocks.", at=0.0)[0]
        .fatal_reason
        is not None
    )
