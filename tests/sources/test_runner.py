"""The one loop over every source: a blocking source is reported by the deadline, alone."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import RawLogLine
from exporter.sources import (
    DEADLINE_EXCEEDED,
    STILL_RUNNING,
    SourceCall,
    SourceHealth,
    SourceRunner,
    run_source,
)
from exporter.sources.logs import FileLogSource
from exporter.sources.pressure import MemoryPressureSource, parse_psi


class FifoReader:
    """A source whose call blocks for real: it opens a FIFO for reading and waits for a writer.

    (The log source refuses FIFOs; this one exists to block the way a stuck syscall does.)
    """

    name = "stuck"

    def __init__(self, path: Path) -> None:
        self.path = path

    def sample(self, deadline: float | None = None) -> tuple[RawLogLine, ...]:
        with open(self.path, "rb") as fh:  # blocks until a writer opens the FIFO
            return tuple(RawLogLine(line.decode().rstrip("\n"), 0.0) for line in fh)

    def close(self) -> None:
        pass


@pytest.mark.integration
def test_a_blocked_source_is_reported_by_the_deadline_and_the_others_still_count(tmp_path):
    fifo = tmp_path / "stuck.fifo"
    os.mkfifo(fifo)
    blocked = FifoReader(fifo)
    psi = MemoryPressureSource()
    runner = SourceRunner(4)
    calls = [SourceCall(blocked, "vllm"), SourceCall(psi)]
    try:
        started = time.monotonic()
        first = runner.run(calls, time.monotonic() + 0.5)
        took = time.monotonic() - started
        second = runner.run(calls, time.monotonic() + 0.2)

        assert took < 2.0
        assert (first[0].status.up, first[0].status.error) == (False, DEADLINE_EXCEEDED)
        assert first[0].status.target == "vllm" and first[0].status.source == "stuck"
        assert (second[0].status.up, second[0].status.error) == (False, STILL_RUNNING)
        assert first[1].status.up and second[1].status.up
        assert runner.stuck == 1

        writer = os.open(fifo, os.O_WRONLY)  # the stuck open() returns; its call ends
        os.write(writer, b"INFO 05-12 02:45:10 hello\n")
        os.close(writer)
        deadline = time.monotonic() + 10
        lines: tuple[RawLogLine, ...] = ()
        while not lines and time.monotonic() < deadline:
            (result, _) = runner.run(calls, time.monotonic() + 0.5)
            lines = result.value or ()  # type: ignore[assignment]
        # the late call's reading is delivered, not dropped
        assert [line.text for line in lines] == ["INFO 05-12 02:45:10 hello"]
    finally:
        runner.close()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_log_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "engine.log"
    if kind == "fifo":
        os.mkfifo(path)
    source = FileLogSource(str(path) if kind == "fifo" else "/dev/zero")
    started = time.monotonic()
    result = run_source("logs", source.sample)
    assert (result.status.up, result.status.error) == (False, "not_regular_file")
    assert time.monotonic() - started < 1.0
    source.close()


def test_psi_lines_become_ratios_and_seconds():
    pressure = parse_psi(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=2500000\n"
        "full avg10=1.25 avg60=0.10 avg300=0.00 total=500000\n"
    )
    assert (pressure.some_ratio, pressure.full_ratio) == (0.125, 0.0125)
    assert (pressure.some_seconds, pressure.full_seconds) == (2.5, 0.5)


def test_a_kernel_without_psi_is_absent_rather_than_broken(tmp_path):
    result = run_source("memory_pressure", MemoryPressureSource(str(tmp_path / "none")).sample)
    assert (result.status.up, result.status.absent, result.status.error) == (
        False,
        True,
        "not_supported",
    )
    assert result.status.hint is not None and "psi=1" in result.status.hint


def _absent() -> None:
    raise SourceAbsent("library_not_found", hint="set nvml = false in [exporter]")


def _down(reason: str) -> None:
    raise SourceError(reason)


def test_an_absent_source_is_logged_once_with_its_hint_and_never_as_down(caplog):
    caplog.set_level("INFO", logger="exporter.sources")
    health = SourceHealth()
    for _ in range(5):
        health.record(run_source("nvml", _absent).status)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "source absent source=nvml target=- reason=library_not_found"
        " hint=set nvml = false in [exporter]"
    ]


def test_an_absent_sources_retry_still_starting_keeps_it_absent(caplog):
    caplog.set_level("INFO", logger="exporter.sources")
    health = SourceHealth()
    for call in (_absent, lambda: _down("starting"), lambda: _down(DEADLINE_EXCEEDED), _absent):
        health.record(run_source("nvml", call).status)
    assert len(caplog.records) == 1 and "source absent" in caplog.records[0].getMessage()


def test_a_source_that_breaks_after_being_absent_is_down(caplog):
    caplog.set_level("INFO", logger="exporter.sources")
    health = SourceHealth()
    health.record(run_source("nvml", _absent).status)
    health.record(run_source("nvml", lambda: _down("driver_not_loaded")).status)
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"]
    assert "source down source=nvml" in caplog.records[1].getMessage()


def test_a_source_still_starting_on_its_first_ticks_is_not_logged_as_down(caplog):
    caplog.set_level("INFO", logger="exporter.sources")
    health = SourceHealth()
    for reason in (DEADLINE_EXCEEDED, "starting"):
        health.record(run_source("nvml", lambda r=reason: _down(r)).status)
    health.record(run_source("nvml", _absent).status)
    assert [r.getMessage().split(" hint=")[0] for r in caplog.records] == [
        "source absent source=nvml target=- reason=library_not_found"
    ]


def test_a_source_that_never_gets_past_starting_is_logged_as_down_at_last(caplog):
    health = SourceHealth()
    for _ in range(11):
        health.record(run_source("nvml", lambda: _down(STILL_RUNNING)).status)
    assert [r.getMessage() for r in caplog.records] == [
        "source down source=nvml target=- reason=still_running"
    ]


def test_this_hosts_memory_pressure_reads_as_ratios():
    if not os.path.exists("/proc/pressure/memory"):
        pytest.skip("this kernel has no PSI (/proc/pressure/memory)")
    pressure = MemoryPressureSource().sample()
    assert 0.0 <= pressure.full_ratio <= pressure.some_ratio <= 1.0


class Recorder:
    """A source that notes which thread ran it and when it finished; sleeps ``seconds`` first."""

    def __init__(self, name: str, seconds: float = 0.0) -> None:
        self.name = name
        self.seconds = seconds
        self.threads: list[int] = []
        self.finished_at = 0.0

    def sample(self, deadline: float | None = None) -> int:
        self.threads.append(threading.get_ident())
        time.sleep(self.seconds)  # a real blocking wait, as a slow server's reply is
        self.finished_at = time.monotonic()
        return len(self.threads)

    def close(self) -> None:
        pass


def test_quick_calls_run_one_after_another_on_one_thread():
    # Side by side, quick /proc and file reads spent more CPU handing the GIL around than
    # they saved (issue 18); a tick of quick calls uses one lane.
    runner = SourceRunner(8)
    sources = [Recorder(f"quick{i}") for i in range(40)]
    try:
        for _ in range(3):
            results = runner.run([SourceCall(s, "t") for s in sources], time.monotonic() + 2)
            assert all(r.status.up for r in results)
    finally:
        runner.close()
    assert len({t for s in sources for t in s.threads}) == 1


def test_a_slow_call_does_not_hold_the_calls_after_it():
    runner = SourceRunner(4)
    slow = Recorder("slow", seconds=0.5)
    quick = [Recorder(f"quick{i}") for i in range(5)]
    try:
        started = time.monotonic()
        results = runner.run([SourceCall(slow), *(SourceCall(q) for q in quick)], started + 2)
    finally:
        runner.close()
    assert all(r.status.up for r in results)
    # Another lane took the queue up while the slow call waited: all done long before it.
    assert max(q.finished_at for q in quick) - started < 0.2
    assert slow.finished_at - started >= 0.5


def test_calls_no_lane_reached_by_the_deadline_are_reported_and_run_next_tick():
    runner = SourceRunner(1)  # one lane only: the blocked call holds it
    slow, after = Recorder("slow", seconds=0.6), Recorder("after")
    try:
        first = runner.run([SourceCall(slow), SourceCall(after)], time.monotonic() + 0.2)
        assert (first[1].status.up, first[1].status.error) == (False, DEADLINE_EXCEEDED)
        time.sleep(0.6)  # the slow call returns; the one left over never started
        assert after.threads == []
        second = runner.run([SourceCall(slow), SourceCall(after)], time.monotonic() + 2)
    finally:
        runner.close()
    assert second[0].status.up and second[0].value == 1  # the late call's reading
    assert second[1].status.up and len(after.threads) == 1
