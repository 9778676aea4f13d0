"""Screens: a layer pattern, opened for speed, still lets through every line it matches."""

from __future__ import annotations

import re

import pytest

from exporter.base.linear import screen_of, widened
from exporter.core.logtext import MATCH_CHARS, clean
from exporter.engines import ENGINES, access, vocabulary
from tests import corpus


def _layer_patterns() -> list[str]:
    """Every pattern a classifier's layers screen: the profiles' and the shared ones."""
    found: dict[str, None] = {}
    layers = [(e.log.fatal, e.log.benign, e.log.markers, e.log.wrappers) for e in ENGINES.values()]
    shared = (access.ACCESS, vocabulary.STOPS, vocabulary.BENIGN, vocabulary.FATAL)
    for group in (*layers, (*shared, vocabulary.WRAPPERS, vocabulary.MARKERS)):
        for patterns in group:
            found.update((p.regex.pattern, None) for p in patterns)
    return list(found)


@pytest.mark.parametrize(
    ("regex", "opened"),
    [
        (r"NCCL.{0,80}?not connected", r"NCCL.*?not connected"),
        (r"done \d{1,6} of", r"done \d+ of"),
        (r"(?: \w+){0,3}?:", r"(?: \w+)*?:"),
        (r"x{2,5}y", r"x{2,}y"),
        (r"\d{4}-\d\d", r"\d{4}-\d\d"),  # an exact count is no counter to open
        (r"literal \{0,5}", r"literal \{0,5}"),  # an escaped brace is text
        (r"[{0,5}] and [^]{1,2}]", r"[{0,5}] and [^]{1,2}]"),  # so is a brace in a class
        (r"\\{0,3}x", r"\\*x"),  # an escaped backslash, then a repeat of it
    ],
)
def test_a_bounded_repeat_is_opened_and_nothing_else_moves(regex: str, opened: str) -> None:
    assert widened(regex) == opened
    re.compile(opened)


def test_an_opened_pattern_reads_further_than_its_bound() -> None:
    line = "NCCL rank 3 " + "x" * 200 + " not connected"
    assert re.search(r"NCCL.{0,80}?not connected", line) is None
    assert re.search(widened(r"NCCL.{0,80}?not connected"), line) is not None


def test_every_corpus_line_a_layer_pattern_matches_passes_its_opened_screen() -> None:
    # The screen only filters: a line its exact pattern matches and the opened one missed
    # would never reach ``re``, and a fatal line would go unseen.
    folder = corpus.require()
    patterns = _layer_patterns()
    assert any(widened(p) != p for p in patterns)
    exact, opened = screen_of(patterns), screen_of(widened(p) for p in patterns)
    assert exact is not None and opened is not None
    checked = 0
    for log in sorted(folder.glob("*.log")):
        for raw in log.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
            text = clean(raw)[:MATCH_CHARS].encode("utf-8", "surrogateescape")
            hits = set(exact.Match(text) or ())
            assert hits <= set(opened.Match(text) or ()), (log.name, raw[:120])
            checked += bool(hits)
    assert checked > 1000
