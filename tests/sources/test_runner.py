"""The one loop over every source: a blocking source is reported by the deadline, alone."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from exporter.core.model import RawLogLine
from exporter.sources import (
    DEADLINE_EXCEEDED,
    STILL_RUNNING,
    Scope,
    SourceCall,
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
    scope = Scope.TARGET

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


def test_a_kernel_without_psi_is_not_supported_rather_than_broken(tmp_path):
    result = run_source("memory_pressure", MemoryPressureSource(str(tmp_path / "none")).sample)
    assert (result.status.up, result.status.error) == (False, "not_supported")


def test_this_hosts_memory_pressure_reads_as_ratios():
    if not os.path.exists("/proc/pressure/memory"):
        pytest.skip("this kernel has no PSI (/proc/pressure/memory)")
    pressure = MemoryPressureSource().sample()
    assert 0.0 <= pressure.full_ratio <= pressure.some_ratio <= 1.0
