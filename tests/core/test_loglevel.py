"""A line's own level field, as an operator reads it off the line."""

from __future__ import annotations

import pytest

from exporter.base.model import LogClass
from exporter.core.loglevel import level_class, line_level

SHAPES = [
    ("E0416 14:45:07.123456 1 server.cc:1] failed", 40),
    ("0.00.174.294 E llama_model_load: error loading model", 40),
    ("[E] [TRT-LLM] Assertion failed", 40),
    ("[W ProcessGroupNCCL.cpp:1] Warning", 30),
    ("ERROR 02-23 10:00:00 [core.py:1] boom", 40),
    ("NCCL_DEBUG=INFO set; worker WARN slow", 30),
    ('time=2025 level=error msg="x"', 40),
    ('{"level":"ERROR","msg":"x"}', 40),
    ("[error] mindie failed", 40),
    ("error: could not load", 40),
    ("<warning> low memory", 30),
    ("an error occurred while reading", None),
    ("stderr=/dev/null overrides", None),
    ("path=/INFO/x only", None),
    ("x\x0bINFO\x1cdone", 20),
    ("worker\x0bE0416 14:45:07.123456 1 x.cc:1] lost", 40),  # \v is whitespace to re
]


@pytest.mark.parametrize(("line", "level"), SHAPES)
def test_each_level_shape_is_read(line, level):
    assert line_level(line) == level


@pytest.mark.parametrize(("line", "level"), SHAPES)
def test_a_line_with_non_ascii_text_reads_the_same_level(line, level):
    # Non-ASCII text takes ``re``'s own search, ASCII the linear finder first: one verdict.
    assert line_level(f"{line} \u00e9\u2026") == level


def test_a_level_past_the_start_of_the_line_is_not_the_lines_own():
    assert line_level("x" * 130 + " ERROR 02-23 10:00:00 late") is None


def test_lines_without_a_level_field_are_classed_by_their_exception_or_warning():
    assert level_class("ValueError: bad shape") is LogClass.ERROR
    assert level_class("UserWarning: TypedStorage is deprecated") is LogClass.WARNING
    assert level_class("Loading weights") is LogClass.INFO
