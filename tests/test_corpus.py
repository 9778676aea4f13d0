"""The verdict over the whole corpus of real logs, as replay-log --json reports it.

Three claims (issue 13): auto gets every README verdict right; the shared vocabulary alone
(``--engine generic``) still gets most failures right and calls no ready start failed; and
no benign line of any fixture is classed fatal. Skipped without the corpus (``tests.corpus``).
"""

from __future__ import annotations

import json

import pytest

from exporter.base.model import LogClass, Phase
from exporter.cli import main
from exporter.commands.replay_log import _classify, _profile, read_lines, replay
from exporter.core.classify import MATCH_CHARS, clean, redact
from exporter.engines import vocabulary
from tests import corpus

LOGS = corpus.require()
EXPECTED = corpus.expected_results(LOGS)
FILES = sorted(EXPECTED)
FAILED = [f for f in FILES if EXPECTED[f][0] == "failed"]
#: Share of failed starts the shared vocabulary alone must get right.
GENERIC_FLOOR = 0.85
#: Files the shared vocabulary alone may get wrong beyond what auto gets wrong (issue 33).
GENERIC_SLACK = 3
#: Benign twins of fatal wordings, by file: (substring of the line, why it is benign).
TWINS = {
    "vllm-18-ready.log": "Desired GPU memory utilization",  # INFO twin of vllm-22/23's oom
    "sglang-17-crash.log": "Init COMPLETE",  # NCCL INFO chatter before a crash
    "tgi-11-ready.log": "Failed to import python tokenizer",  # ERROR, but a fallback
    "vllm-27-crash.log": "Failed to import vllm_ascend_C",  # a warning, not the failure
    "sglang-05-ready.log": "exit code -15",  # the operator's stop
    "llamacpp-08-oom.log": "HTTP server is listening",  # listens before it loads
}


@pytest.mark.parametrize("name", FILES)
def test_auto_json_gets_the_readme_outcome_and_reason(name, capsys):
    assert main(["replay-log", "--engine", "auto", "--json", str(LOGS / name)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["outcome"], doc["reason"]) == EXPECTED[name]
    assert doc["engine_source"] in ("detected", "unknown")
    assert (doc["engine_line"] is None) == (doc["engine_source"] == "unknown")
    if doc["outcome"] == "failed":
        assert isinstance(doc["reason_detail"], str) and doc["reason_detail"].startswith("line ")
        assert len(doc["reason_detail"]) <= 220
    else:
        assert doc["reason_detail"] is None


def test_the_shared_vocabulary_alone_carries_the_failures():
    right, wrong = 0, []
    for name in FILES:
        result = replay(read_lines(LOGS / name), "generic")
        verdict = (result.outcome, str(result.reason) if result.reason else None)
        if EXPECTED[name][0] == "ready":
            assert result.outcome != "failed", name
        right += name in FAILED and verdict == EXPECTED[name]
        if verdict != EXPECTED[name]:
            wrong.append(name)
    share = right / len(FAILED)
    print(f"--engine generic: {right}/{len(FAILED)} failed starts right ({share:.0%})")
    assert share >= GENERIC_FLOOR
    # auto gets every file right (the test above), so this is "within 3 files of auto"
    assert len(wrong) <= GENERIC_SLACK, wrong


@pytest.mark.parametrize("name", FILES)
def test_no_benign_line_is_classed_fatal(name):
    lines = read_lines(LOGS / name)
    result = replay(lines, None)
    fatal = [
        e
        for ln in _classify(lines, _profile(result.engine), 0.0)
        for e in ln.events
        if e.cls is LogClass.FATAL
    ]
    outcome, reason = EXPECTED[name]
    if outcome == "ready":
        ready = next(p.line for p in result.phases if p.phase is Phase.READY)
        assert [e.line_no for e in fatal if (e.line_no or 0) < ready] == []
    elif outcome == "incomplete":
        assert fatal == []
    else:
        assert str(fatal[0].fatal_reason) == reason  # the first fatal line is the cause
    if name in TWINS:
        assert not [e for e in fatal if TWINS[name] in e.text]


def test_the_fatal_hint_lets_through_every_line_a_family_matches():
    # The hint is a speed screen: it must never hide a line some shared family would match.
    for name in FILES:
        for _, raw in read_lines(LOGS / name):
            text = clean(raw)[:MATCH_CHARS]
            if any(p.regex.search(text) for p in vocabulary.FATAL):
                assert vocabulary.FATAL_HINT.search(text), (name, text[:120])


def test_the_corpus_keeps_its_lines():
    # Redaction by shape (issue 19) must not eat real logs: none of the corpus holds a secret,
    # and the few lines it changes print a setting named like one ("api_key: None" kept).
    changed = [
        line
        for path in sorted(LOGS.rglob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if redact(line) != line
    ]
    assert all("<redacted>" in redact(line) for line in changed)
    assert len(changed) <= 10, changed
