"""The movement of a start, kept bounded: points, rates, marks and the previous start."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.base.model import LogClass, LogEvent, Observation, Phase, ProcessSample
from exporter.core.lifecycle import initial_state
from exporter.core.trail import MAX_MARKS, MAX_POINTS, Trails, follow

T0 = 1_700_000_000.0
GIB = 1 << 30


def tick(trails, i, *, pid=10, gpu=((0, GIB), (1, GIB)), events=(), phase=Phase.LOADING):
    start = T0 if pid == 10 else T0 + 5000
    state = replace(initial_state("t"), create_time=start, phase=phase, pid=pid)
    p = ProcessSample(pid, start, (pid,), 2 * GIB, 1.0 + 0.5 * i, 100 * 2**20 * i)
    obs = Observation("t", start + i, process=p, log_events=events)
    return follow(trails, obs, state, gpu)


def test_points_carry_rates_and_memory_from_the_process_start():
    trails = Trails()
    for i in range(3):
        trails = tick(trails, i)
    rows = list(trails.current.rows())
    assert [r[0] for r in rows] == [0.0, 1.0, 2.0]  # seconds since the process started
    assert rows[0][1] is None  # no rate before a second sample
    assert rows[2][1] == pytest.approx(100 * 2**20)  # read bytes/s
    assert rows[2][3] == pytest.approx(0.5)  # CPU cores
    assert rows[2][5:] == (pytest.approx(GIB), pytest.approx(GIB))


def test_a_long_start_stays_within_its_points_by_thinning():
    trails = Trails()
    for i in range(3 * MAX_POINTS):
        trails = tick(trails, i)
    cur = trails.current
    assert cur.count <= MAX_POINTS and cur.stride == 4
    times = [r[0] for r in cur.rows()]
    assert times == sorted(times) and times[-1] >= 3 * MAX_POINTS - cur.stride


def test_a_new_process_keeps_the_last_start_as_the_previous():
    trails = Trails()
    for i in range(5):
        trails = tick(trails, i)
    trails = tick(trails, 0, pid=20)
    assert trails.previous is not None and trails.previous.pid == 10
    assert trails.previous.count == 5 and trails.current.count == 1


def test_gpus_that_appear_later_get_a_column_unknown_before():
    trails = tick(Trails(), 0, gpu=())
    trails = tick(trails, 1, gpu=((0, GIB),))
    first, second = trails.current.rows()
    assert first[5:] == (None,) and second[5:] == (pytest.approx(GIB),)


def test_marks_and_bands_are_bounded_and_repeats_skipped():
    trails = Trails()
    for i in range(2 * MAX_MARKS):
        ev = LogEvent(LogClass.MARKER, f"marker {i}", T0 + i, marker="x")
        rep = LogEvent(LogClass.MARKER, "again", T0 + i, repeat=True)
        trails = tick(trails, i, events=(ev, rep), phase=Phase.LOADING if i % 2 else Phase.STARTING)
    cur = trails.current
    assert len(cur.marks) == MAX_MARKS and cur.marks[-1].text == f"marker {2 * MAX_MARKS - 1}"
    assert all(m.text != "again" for m in cur.marks)
    assert len(cur.bands) <= MAX_MARKS
