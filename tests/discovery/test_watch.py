"""The stream splitting both discovery clients share: JSON lines from arbitrary chunks."""

from __future__ import annotations

import pytest

from exporter.discovery.watch import ApiError, json_lines


def test_lines_split_across_chunks_come_out_whole_and_blank_ones_are_skipped():
    chunks = [b'{"a"', b": 1}\n\n", b'{"b": 2}\n{"c"', b": 3}"]
    assert list(json_lines(iter(chunks))) == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}']


@pytest.mark.parametrize("ending", [b"", b"\n"], ids=["unended", "ended"])
def test_a_line_past_the_cap_is_refused_by_name(ending):
    chunks = [b"x" * 40] * 3 + [ending]
    with pytest.raises(ApiError) as caught:
        list(json_lines(iter(chunks), max_line=100))
    assert caught.value.reason == "line_too_long"


def test_a_line_at_the_cap_passes():
    assert list(json_lines(iter([b"x" * 60, b"x" * 40 + b"\ny"]), max_line=100)) == [
        b"x" * 100,
        b"y",
    ]
