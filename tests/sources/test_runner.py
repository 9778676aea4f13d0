"""The one loop over every source: a blocking source is reported by the deadline, alone."""

from __future__ import annotations

import os
import time

import pytest

from exporter.core.model import RawLogLine
from exporter.sources import DEADLINE_EXCEEDED, STILL_RUNNING, SourceCall, SourceRunner
from exporter.sources.logs import FileLogSource
from exporter.sources.pressure import MemoryPressureSource, parse_psi


@pytest.mark.integration
def test_a_source_blocked_on_a_fifo_is_reported_and_the_others_still_count(tmp_path):
    fifo = tmp_path / "engine.log"
    os.mkfifo(fifo)
    blocked = FileLogSource(str(fifo))  # opening a FIFO blocks until a writer comes
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
        assert first[0].status.target == "vllm" and first[0].status.source == "logs"
        assert (second[0].status.up, second[0].status.error) == (False, STILL_RUNNING)
        assert first[1].status.up and second[1].status.up

        writer = os.open(fifo, os.O_WRONLY)  # the stuck open() returns; its call ends
        os.write(writer, b"INFO 05-12 02:45:10 hello\n")
        os.close(writer)
        deadline = time.monotonic() + 10
        lines: tuple[RawLogLine, ...] = ()
        while not lines and time.monotonic() < deadline:
            (result, _) = runner.run(calls, time.monotonic() + 0.5)
            lines = result.value or ()  # type: ignore[assignment]
        assert [line.text for line in lines] == ["INFO 05-12 02:45:10 hello"]
    finally:
        runner.close()
        blocked.close()


def test_psi_lines_become_ratios_and_seconds():
    pressure = parse_psi(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=2500000\n"
        "full avg10=1.25 avg60=0.10 avg300=0.00 total=500000\n"
    )
    assert (pressure.some_ratio, pressure.full_ratio) == (0.125, 0.0125)
    assert (pressure.some_seconds, pressure.full_seconds) == (2.5, 0.5)


def test_a_kernel_without_psi_is_not_supported_rather_than_broken(tmp_path):
    from exporter.sources import run_source

    result = run_source("memory_pressure", MemoryPressureSource(str(tmp_path / "none")).sample)
    assert (result.status.up, result.status.error) == (False, "not_supported")


def test_this_hosts_memory_pressure_reads_as_ratios():
    if not os.path.exists("/proc/pressure/memory"):
        pytest.skip("this kernel has no PSI (/proc/pressure/memory)")
    pressure = MemoryPressureSource().sample()
    assert 0.0 <= pressure.full_ratio <= pressure.some_ratio <= 1.0
