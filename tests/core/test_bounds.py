"""Each phase's bound, from per-tick readings folded in by ``track`` and judged by ``advice``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exporter.base.model import LogClass, LogEvent, Observation, Phase, ProcessSample
from exporter.core.advice import THRESHOLDS, Verdicts, follow_bounds, verdicts
from exporter.core.bounds import Bound, Bounds, track
from exporter.core.lifecycle import TargetState

MIB = 1 << 20
GIB = 1 << 30


@dataclass
class Engine:
    """A pretend engine's counters, moved tick by tick as one phase of a start would."""

    pid: int = 100
    at: float = 1000.0
    read: int = 0
    disk: int = 0
    cpu: float = 0.0
    rss: int = 50 * MIB
    gpu_mem: int = 0
    downloaded: int = 0

    def tick(self, phase: Phase, bounds: Bounds, *, gpu: float | None = None, lines=()) -> Bounds:
        obs = Observation(
            target="t",
            at=self.at,
            process=ProcessSample(self.pid, 990.0, (self.pid,), self.rss, self.cpu, self.read),
            disk_read_bytes=self.disk,
            gpu_memory_bytes=self.gpu_mem,
            log_events=tuple(LogEvent(LogClass.INFO, t, self.at) for t in lines),
        )
        state = TargetState("t", phase=phase, create_time=990.0, download_bytes=self.downloaded)
        return track(bounds, obs, state, gpu, THRESHOLDS)

    def run(self, phase: Phase, bounds: Bounds, seconds: int, **per_second) -> Bounds:
        """``seconds`` one-second ticks of ``phase``, each moving the counters by ``per_second``."""
        gpu = per_second.pop("gpu", None)
        lines = per_second.pop("lines", ())
        for _ in range(seconds):
            self.at += 1
            for name, step in per_second.items():
                setattr(self, name, getattr(self, name) + step)
            bounds = self.tick(phase, bounds, gpu=gpu, lines=lines)
        return bounds


def start(engine: Engine, before: Bounds | None = None) -> Bounds:
    return engine.tick(Phase.STARTING, before or Bounds())


def finish(engine: Engine, bounds: Bounds) -> Bounds:
    engine.at += 1
    return engine.tick(Phase.READY, bounds)


def phases(v: Verdicts) -> dict[str, str]:
    return {p.figures.phase.value: p.bound.value for p in v.last}


def test_a_start_reads_each_phase_bound_from_its_own_figures():
    e = Engine()
    b = start(e)
    b = e.run(Phase.STARTING, b, 5, cpu=1.2)  # imports: busy cores
    b = e.run(Phase.LOADING, b, 10, read=200 * MIB, disk=200 * MIB, cpu=0.3)
    b = e.run(Phase.INITIALIZING, b, 5, cpu=1.0, gpu=0.0)  # compile, GPU flat
    b = e.run(Phase.INITIALIZING, b, 3, gpu=0.9)  # graph capture
    v = verdicts(finish(e, b), THRESHOLDS)
    assert phases(v) == {"starting": "cpu", "loading": "disk", "initializing": "cpu"}
    assert not v.running
    loading = v.last[1]
    assert loading.advice.startswith("loading 10s: read 2.0 GiB at 200.0 MiB/s")
    assert "this disk's best seen 200.0 MiB/s: disk-bound" in loading.advice


def test_a_throttled_disk_says_what_the_best_rate_seen_would_take():
    e = Engine()
    b = start(e)
    b = e.run(Phase.LOADING, b, 10, read=400 * MIB)
    b = finish(e, b)
    e = Engine(pid=101, at=e.at + 60)
    b = start(e, b)
    b = e.run(Phase.LOADING, b, 40, read=100 * MIB)
    v = verdicts(b, THRESHOLDS)
    now = v.current
    assert now is not None and now.bound is Bound.DISK
    assert now.would_take_seconds == pytest.approx(10)
    assert "this disk's best seen 400.0 MiB/s: disk-bound; at its best this would take 10s" in (
        now.advice
    )
    assert (
        "the fastest earlier start took 11s here, reading the disk" in now.advice
    )  # + its last tick


def test_a_warm_start_loads_from_the_page_cache_and_the_cold_one_says_so():
    e = Engine()
    b = start(e)
    b = e.run(Phase.LOADING, b, 4, rss=100 * MIB, cpu=0.2)  # mmap hits the cache: RSS grows
    b = finish(e, b)
    e = Engine(pid=101, at=e.at + 60)
    b = start(e, b)
    b = e.run(Phase.LOADING, b, 30, read=100 * MIB)
    v = verdicts(finish(e, b), THRESHOLDS)
    assert phases(v)["loading"] == "disk"
    assert v.last[-1].advice.endswith(
        "the fastest earlier start took 5s here, from the page cache (a cold page cache)"
    )


def test_a_finished_load_without_reads_came_from_the_page_cache():
    e = Engine()
    b = e.run(Phase.LOADING, start(e), 3)
    assert verdicts(b, THRESHOLDS).current.bound is Bound.IDLE  # nothing moves yet
    v = verdicts(finish(e, b), THRESHOLDS)
    assert phases(v) == {"loading": "page_cache"}
    assert "the weights came from the page cache: a warm start" in v.last[0].advice


def test_download_gpu_peers_and_idle():
    e = Engine()
    b = start(e)
    b = e.run(Phase.DOWNLOADING, b, 10, downloaded=50 * MIB)
    b = e.run(Phase.STARTING, b, 10, lines=("[Gloo] Rank 8 is NOT connected to: [1]",))
    b = e.run(Phase.INITIALIZING, b, 5, gpu=0.95, cpu=0.1)
    v = verdicts(b, THRESHOLDS)
    assert [(p.figures.phase.value, p.bound.value) for p in v.running] == [
        ("downloading", "network"),
        ("starting", "peers"),
        ("initializing", "gpu"),
    ]
    assert "downloaded 500.0 MiB at 50.0 MiB/s: network-bound" in v.running[0].advice
    assert "(\u005bGloo] Rank 8 is NOT connected to: [1]): peers-bound" in v.running[1].advice
    b = e.run(Phase.INITIALIZING, b, 60)
    quiet = verdicts(b, THRESHOLDS).current
    assert quiet.bound is Bound.IDLE  # the mean says GPU, the last minute says nothing
    assert "nothing busy for 1m00s" in quiet.advice
    e2 = Engine(pid=7)
    b2 = e2.run(Phase.INITIALIZING, start(e2), 30)
    assert verdicts(b2, THRESHOLDS).current.bound is Bound.IDLE


def test_a_server_at_rest_keeps_the_very_same_value():
    e = Engine()
    b = finish(e, e.run(Phase.LOADING, start(e), 3, read=100 * MIB))
    judged = verdicts(b, THRESHOLDS)
    obs = Observation("t", e.at + 1, ProcessSample(e.pid, 990.0, (e.pid,), 1, 1.0, e.read))
    state = TargetState("t", phase=Phase.SERVING, create_time=990.0)
    assert follow_bounds(b, judged, obs, state, (), ()) == (b, judged)
    assert follow_bounds(b, judged, obs, state, (), ())[0] is b


def test_a_server_first_seen_ready_has_no_start_to_explain():
    e = Engine()
    b = e.tick(Phase.SERVING, Bounds())
    assert b.current is None
    assert verdicts(b, THRESHOLDS) == Verdicts()


def test_a_load_that_stopped_reading_is_idle_once_quiet_for_ten_seconds():
    e = Engine()
    b = e.run(Phase.LOADING, start(e), 10, read=100 * MIB)
    b = e.run(Phase.LOADING, b, 9)
    assert verdicts(b, THRESHOLDS).current.bound is Bound.DISK  # the mean still reads
    b = e.run(Phase.LOADING, b, 1)
    now = verdicts(b, THRESHOLDS).current
    assert now.bound is Bound.IDLE
    assert "idle (a lock, a sleep, a hang in the making)" in now.advice


def test_a_warm_load_that_reads_its_libraries_still_came_from_the_page_cache():
    e = Engine()
    b = e.run(Phase.LOADING, start(e), 10, read=20 * MIB, rss=2 * GIB)
    v = verdicts(finish(e, b), THRESHOLDS)
    assert phases(v)["loading"] == "page_cache"  # 200 MiB read, 20 GiB mapped


def test_gpu_memory_grown_by_a_cold_load_is_no_sign_of_the_page_cache():
    e = Engine()
    b = e.run(Phase.LOADING, start(e), 10, read=20 * MIB, rss=20 * MIB, gpu_mem=2 * GIB)
    assert phases(verdicts(finish(e, b), THRESHOLDS))["loading"] == "disk"


def test_a_tick_whose_process_source_failed_neither_ends_the_start_nor_counts():
    e = Engine()
    b = e.run(Phase.LOADING, start(e), 5, read=100 * MIB)
    unseen = Observation("t", e.at + 1, process_error="permission_denied")
    state = TargetState("t", phase=Phase.LOADING, create_time=990.0)
    assert track(b, unseen, state, None, THRESHOLDS) is b
