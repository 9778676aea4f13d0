"""A unit's exit as systemd tells it, read from a real journal file, ends the start (issue 33).

A start over in milliseconds leaves no process for any sample to find; systemd's own lines
about the unit (PID 1's, read with the unit's journal) still say that its process started
and exited, and how. Journal files are written by ``systemd-journal-remote`` as in
``test_logs.py``; both readers (systemd-python and ``journalctl --output=json``) feed the
real core tick, as the daemon does.
"""

from __future__ import annotations

import time

import pytest

from exporter.base.model import (
    FailureReason,
    GpuReading,
    HostReadings,
    LogReading,
    Phase,
    ProbeKind,
    ProbeOutcome,
    ProbeResult,
    ProcessSample,
)
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import initial_state
from exporter.core.observe import TargetReadings, TargetWorld
from exporter.core.snapshot import TargetInfo
from exporter.core.tick import TargetPlan, advance_tick
from exporter.engines import ENGINES
from exporter.sources.journal import JournalctlLogSource, JournalLogSource
from tests.sources.test_logs import UNIT, Journal

pytestmark = pytest.mark.integration
PLAN = TargetPlan(TargetInfo("vllm", "vllm"))
OLD = ProcessSample(100, 1_000.0, (100,), 1 << 30, 5.0, 0)


def _probe(ok: bool, at: float) -> ProbeResult:
    outcome = ProbeOutcome.OK if ok else ProbeOutcome.REFUSED
    return ProbeResult(ProbeKind.HEALTH, outcome, 200 if ok else None, 0.001, at)


def _systemd(journal: Journal, *messages: str) -> None:
    """Lines PID 1 writes about the unit (``UNIT=``, not ``_SYSTEMD_UNIT=``)."""
    journal.write(*messages, unit="init.scope", fields={"UNIT": UNIT, "_PID": "1"})


class Watched:
    """One target whose log is the unit's journal, advanced a tick at a time by the core."""

    def __init__(self, journal: Journal, reader: type) -> None:
        journal.write("sshd: session opened", unit="sshd.service")  # the file exists
        self.source = reader("vllm", cursor_file=None, since=None, journal_dir=str(journal.dir))
        self.world = TargetWorld(initial_state("vllm"), LogClassifier(ENGINES["vllm"].log))
        self.journal = journal

    def tick(self, *, process: ProcessSample | None, ok: bool, lines: int = 0) -> TargetWorld:
        """One tick at the journal's present; ``lines``: entries to wait for (journalctl)."""
        now = self.journal.usec / 1e6 + 0.2
        reading = self._read(lines)
        (outcome,) = advance_tick(
            [self.world],
            [TargetReadings(process=process, logs=reading, probe=_probe(ok, now))],
            [PLAN],
            HostReadings(),
            GpuReading(gpus=()),
            now,
        ).targets
        self.world = outcome.world
        self.journal.usec += 1_000_000  # a tick later, the next entries are written
        return outcome.world

    def _read(self, lines: int) -> LogReading:
        got = list(self.source.sample().lines)
        deadline = time.monotonic() + 20
        while len(got) < lines and time.monotonic() < deadline:
            time.sleep(0.05)
            got += self.source.sample().lines
        assert len(got) >= lines, [line.text for line in got]
        return LogReading(tuple(got))


@pytest.fixture(params=[JournalLogSource, JournalctlLogSource], ids=["python", "journalctl"])
def watched(request, tmp_path):
    (tmp_path / "journal").mkdir()
    target = Watched(Journal(tmp_path / "journal"), request.param)
    yield target
    target.source.close()


def test_a_units_first_burst_after_the_reader_opened_is_read_whole(watched):
    # Opened on a journal without the unit's entries, both readers used to return only the
    # last entry of the first burst (followed from the tail of nothing): a whole failed start.
    watched.source.sample()
    watched.journal.write("one", "two", "three")
    deadline = time.monotonic() + 20
    got: list[str] = []
    while len(got) < 3 and time.monotonic() < deadline:
        got += [line.text for line in watched.source.sample().lines]
        time.sleep(0.05)
    assert got == ["one", "two", "three"]


def test_a_unit_whose_process_exited_before_any_sample_fails_its_start(watched):
    assert watched.tick(process=None, ok=False).state.phase is Phase.DOWN
    began = watched.journal.usec / 1e6 + 0.001
    _systemd(watched.journal, "Starting vllm.service - vLLM OpenAI server...")
    watched.journal.write("usage: vllm serve [-h] MODEL: error: unrecognized arguments: --tp")
    _systemd(
        watched.journal,
        f"{UNIT}: Main process exited, code=exited, status=2/INVALIDARGUMENT",
        f"{UNIT}: Failed with result 'exit-code'.",
    )
    state = watched.tick(process=None, ok=False, lines=4).state

    assert state.phase is Phase.FAILED and state.failure_reason is FailureReason.EXITED
    assert state.reason == "fatal log line: exited"
    assert "status=2/INVALIDARGUMENT" in (state.reason_detail or "")
    last = state.last_cold_start
    assert last is not None and last.outcome == "failed" and last.reason == "exited"
    assert last.started_at == pytest.approx(began, abs=1e-3)  # systemd's "Starting" line


def test_a_ready_unit_restarted_onto_a_start_that_fails_within_the_tick(watched):
    assert watched.tick(process=OLD, ok=True).state.phase is Phase.READY
    _systemd(
        watched.journal,
        "Stopping vllm.service - vLLM OpenAI server...",
        f"{UNIT}: Main process exited, code=killed, status=15/TERM",
        f"{UNIT}: Deactivated successfully.",
        "Stopped vllm.service - vLLM OpenAI server.",
        "Starting vllm.service - vLLM OpenAI server...",
        "Started vllm.service - vLLM OpenAI server.",
        f"{UNIT}: Main process exited, code=exited, status=203/EXEC",
        f"{UNIT}: Failed with result 'exit-code'.",
    )
    state = watched.tick(process=None, ok=False, lines=8).state

    moves = [(t.from_phase, t.to_phase, t.reason) for t in state.transitions]
    assert moves[-3:] == [
        (Phase.READY, Phase.DOWN, "process exited"),  # the stop is no failure of its own
        (Phase.DOWN, Phase.STARTING, "log marker announces starting"),
        (Phase.STARTING, Phase.FAILED, "fatal log line: exited"),
    ]
    assert state.counters.deaths == ((FailureReason.EXITED, 1),)
    assert state.counters.start_failures == ((FailureReason.EXITED, 1),)
    assert state.last_cold_start is not None and state.last_cold_start.outcome == "failed"


@pytest.mark.parametrize(
    "how",
    ["code=killed, status=15/TERM", "code=exited, status=0/SUCCESS"],
    ids=["stopped", "clean-exit"],
)
def test_a_unit_stopped_or_exiting_cleanly_goes_down_without_a_failure(watched, how):
    watched.tick(process=OLD, ok=True)
    _systemd(
        watched.journal,
        "Stopping vllm.service - vLLM OpenAI server...",
        f"{UNIT}: Main process exited, {how}",
        "Stopped vllm.service - vLLM OpenAI server.",
    )
    state = watched.tick(process=None, ok=False, lines=3).state

    assert state.phase is Phase.DOWN and state.reason == "process exited"
    assert state.counters.start_failures == () and state.last_cold_start is None


def test_a_crash_of_a_ready_unit_is_its_death_not_a_failed_start(watched):
    watched.tick(process=OLD, ok=True)
    _systemd(
        watched.journal,
        f"{UNIT}: Main process exited, code=dumped, status=11/SEGV",
        f"{UNIT}: Failed with result 'core-dump'.",
    )
    state = watched.tick(process=None, ok=False, lines=2).state

    assert state.phase is Phase.DOWN
    assert state.reason == "process exited after a fatal log line: crash"
    assert state.counters.deaths == ((FailureReason.CRASH, 1),)
    assert state.last_cold_start is None
