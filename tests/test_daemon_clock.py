"""The daemon's clock follows wall-clock steps; ticks that overrun the interval are reported.

The clock takes its wall and monotonic reads as callables, so a step is injected without
changing the machine's clock (which would disturb every other process here).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
import time
import typing
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.base.model import Phase
from exporter.config import Settings, Target
from exporter.core.lifecycle import TIMESTAMP_FIELDS, TargetState, shifted
from exporter.daemon import AnchoredClock, Daemon
from exporter.history import History
from exporter.render.metrics import SnapshotCollector
from tests.httpservers import closed_port


class FakeClocks:
    """A wall clock that can be stepped and a monotonic clock that only moves forward."""

    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = 1_700_000_000.0

    def advance(self, seconds: float, *, wall_jitter: float = 0.0) -> None:
        self.mono += seconds
        self.wall += seconds + wall_jitter


def test_jitter_below_a_second_is_ignored_and_time_follows_the_monotonic_clock():
    c = FakeClocks()
    clock = AnchoredClock(lambda: c.wall, lambda: c.mono)
    start = clock()
    c.advance(5.0, wall_jitter=0.4)  # NTP slewing, a read that raced a tick
    assert clock() - start == 5.0
    c.advance(5.0, wall_jitter=-0.4)
    assert clock() - start == 10.0
    assert clock.steps == 0


def test_a_step_of_the_wall_clock_re_anchors_the_timestamps():
    c = FakeClocks()
    clock = AnchoredClock(lambda: c.wall, lambda: c.mono)
    before = clock()
    c.advance(1.0, wall_jitter=600.0)  # `date -s`, an NTP step ten minutes forward
    assert clock() == c.wall
    assert clock.steps == 1 and clock.last_step_seconds == 600.0
    after = clock()
    c.advance(2.0)
    assert clock() - after == 2.0  # from the new anchor on, monotonic again
    c.advance(1.0, wall_jitter=-3600.0)  # and back an hour
    assert clock() == c.wall < before
    assert clock.steps == 2


def test_a_running_daemon_exports_the_stepped_wall_clock(tmp_path, caplog):
    c = FakeClocks()
    clock = AnchoredClock(lambda: c.wall, lambda: c.mono)
    daemon = Daemon(
        Settings(interval_seconds=1.0, state_directory=str(tmp_path), nvml=False),
        clock=clock,
        history=History.open(None),
    )
    try:
        assert daemon.tick().taken_at == c.wall
        c.advance(1.0, wall_jitter=600.0)
        with caplog.at_level(logging.WARNING, logger="exporter.daemon"):
            assert daemon.tick().taken_at == c.wall
        assert "wall clock stepped" in caplog.text and "step_s=600.000" in caplog.text
    finally:
        daemon.close()


def exposition(daemon: Daemon) -> str:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: daemon.latest, "test"))
    return generate_latest(registry).decode()


def test_ticks_that_overrun_the_interval_are_counted_and_logged_once_a_minute(tmp_path, caplog):
    slow = {"seconds": 0.0}
    target = Target("slow", "openai", f"http://127.0.0.1:{closed_port()}", "/health", 0.1)

    def slow_step(*_: object) -> None:  # stands in for a slow source: bounded and exact
        time.sleep(slow["seconds"])

    daemon = Daemon(
        Settings(
            interval_seconds=0.2, state_directory=str(tmp_path), nvml=False, targets=(target,)
        ),
        history=History.open(None),
        on_step=slow_step,
    )
    try:
        daemon.tick()
        assert daemon.latest is not None and daemon.latest.tick_overruns == 0
        assert "inference_exporter_tick_overruns_total 0.0" in exposition(daemon)
        slow["seconds"] = 0.3
        with caplog.at_level(logging.WARNING, logger="exporter.daemon"):
            for _ in range(3):
                daemon.tick()
        assert daemon.latest.tick_overruns == 3
        assert "inference_exporter_tick_overruns_total 3.0" in exposition(daemon)
        warnings = [r for r in caplog.records if "tick overran" in r.getMessage()]
        assert len(warnings) == 1, caplog.text  # rate-limited: not one line per tick
        assert "interval_s=0.2" in warnings[0].getMessage()
    finally:
        daemon.close()


@pytest.fixture
def sleeper() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real process to watch, found by a marker on its command line."""
    marker = f"clock-step-{uuid.uuid4().hex[:12]}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])
    try:
        yield marker, child
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_wall_clock_step_mid_start_moves_timestamps_but_no_duration(tmp_path, sleeper, step):
    marker, child = sleeper
    c = FakeClocks()
    c.wall = time.time()  # the process's start time is read from the real kernel clock
    target = Target(
        "engine", "openai", f"http://127.0.0.1:{closed_port()}", "/health", 0.1, cmdline=marker
    )
    # The clocks here are fake, but a tick's sampling deadline is the real interval: a loaded
    # box once took over 1 s for the first /proc walk, and the target read "not observed yet".
    daemon = Daemon(
        Settings(
            interval_seconds=30.0, state_directory=str(tmp_path), nvml=False, targets=(target,)
        ),
        clock=AnchoredClock(lambda: c.wall, lambda: c.mono),
        history=History.open(None),
    )
    try:
        before = daemon.tick().targets[0].state
        assert before.pid == child.pid and before.phase not in (Phase.DOWN, Phase.FAILED)
        c.advance(2.0, wall_jitter=step)
        after = daemon.tick().targets[0].state
        assert after.pid == child.pid and after.counters.restarts == 0  # the same engine run
        assert after.create_time == pytest.approx(before.create_time + step)
        assert after.phase_since == pytest.approx(before.phase_since + step)
        assert not after.stalled  # an hour "without progress" that never happened
        # No jump by the step: 2 s more of quiet at most (less when the child showed progress).
        assert after.seconds_since_progress <= before.seconds_since_progress + 2 + 1e-6
        assert daemon.latest is not None and daemon.latest.taken_at == c.wall
    finally:
        daemon.close()


def _time_fields(cls: type, seen: set[type]) -> Iterator[tuple[str, str]]:
    """(class.field, type) for every float field of ``cls`` and the dataclasses it holds."""
    if cls in seen or not dataclasses.is_dataclass(cls):
        return
    seen.add(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if "float" in str(hint):
            yield f"{cls.__name__}.{f.name}", str(hint)
        for arg in _leaves(hint):
            yield from _time_fields(arg, seen)


def _leaves(hint: object) -> Iterator[type]:
    args = typing.get_args(hint)
    if not args and isinstance(hint, type):
        yield hint
    for arg in args:
        yield from _leaves(arg)


def test_every_timestamp_field_of_the_state_is_one_the_clock_step_moves():
    """A new ``*_at`` field that ``shifted`` did not know would jump at the next step."""
    durations = re.compile(
        r"(_seconds|_per_second|_ratio|^\w+\.longest_quiet|^Histogram\.bounds"
        r"|^EngineReport\.steps)$"
    )
    unknown = [
        name
        for name, _ in _time_fields(TargetState, set())
        if name.split(".")[1] not in TIMESTAMP_FIELDS and not durations.search(name)
    ]
    assert unknown == [], "name them in TIMESTAMP_FIELDS or as a duration (_seconds)"
    moved = shifted(
        TargetState("t", phase_since=10.0, create_time=5.0, last_progress_at=9.0), 100.0
    )
    assert (moved.phase_since, moved.create_time, moved.last_progress_at) == (110, 105, 109)
