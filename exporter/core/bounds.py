"""What bounded each phase of a cold start: per-phase figures, accumulated one tick at a time.

Pure: ``track`` folds one tick's observation (already taken: tree counters, the weights'
disk reads, GPU utilisation, log lines) into a compact ``Bounds`` value; ``judge`` names each
phase's bound from its figures and the ``BoundThresholds`` (data, documented in
docs/architecture.md). No I/O, no clock: the observation's time is the only time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

from exporter.base.model import STARTUP_PHASES, Observation, Phase
from exporter.base.records import ColdStart
from exporter.core.lifecycle import TargetState
from exporter.engines.vocabulary import PEER_WAIT


class Bound(enum.StrEnum):
    """What limited a phase; the values are public label values and ``/status`` words."""

    DISK = "disk"
    PAGE_CACHE = "page_cache"
    NETWORK = "network"
    CPU = "cpu"
    GPU = "gpu"
    PEERS = "peers"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class BoundThresholds:
    """Where one bound ends and the next begins; tuned on the simulator and real engines.

    Attributes:
        reading_bytes_per_second: the tree reads from the device at least this fast to count
            as reading (the simulator's throttled disk reads 5 MiB/s; an idle engine's
            imports read well under 1 MiB/s once its libraries are cached).
        reading_bytes: and at least this much over the phase, so a burst of imports is not
            a disk-bound phase.
        near_best_ratio: a read rate this close to the best one seen is the device's limit.
        best_min_bytes: a phase sets the device's best rate only after reading this much
            (shorter reads are dominated by the device's cache and read-ahead).
        busy_cores: mean CPU cores busy over the phase to call it CPU work. A compile
            keeps a core busy on an idle host, a waiting engine stays under 0.05; on a
            host whose cores are all taken (the shared 2-core CI box at load 15) the
            simulator's compile gets only 0.15-0.3 of one, hence a tenth of a core.
        busy_gpu_ratio: mean GPU utilisation of the target's GPUs to call it GPU work
            (graph capture and warm-up run at 60-100 %, for part of initializing: the
            simulator's vLLM spends 60 % of it capturing, a mean of 36 %).
        loaded_bytes: resident or GPU memory grown this much in a loading phase with few
            reads: the weights came from the page cache.
        cached_share: a loading phase that read less than this share of what its resident
            memory grew by loaded from the page cache, however fast it read the rest
            (libraries, a tokenizer: a warm 600 GiB load still reads a few hundred MiB).
            Resident, not GPU memory: mmap'd weights count there as they are touched,
            from the disk or from the cache alike.
        slower_ratio: a phase this many times longer than the fastest earlier start's
            is worth saying so (a compile cache miss, a cold cache).
        idle_seconds: a running phase in which nothing moved for this long is idle now,
            whatever its means say (a load that hung after reading half the weights).
    """

    reading_bytes_per_second: float = 2 * 1024 * 1024
    reading_bytes: int = 16 * 1024 * 1024
    near_best_ratio: float = 0.7
    best_min_bytes: int = 32 * 1024 * 1024
    busy_cores: float = 0.1
    busy_gpu_ratio: float = 0.3
    loaded_bytes: int = 16 * 1024 * 1024
    cached_share: float = 0.1
    slower_ratio: float = 1.5
    idle_seconds: float = 10.0


#: A word of every ``PEER_WAIT`` alternative, lower case: lines without one are not searched.
_PEER_WORDS: Final = ("rendezvous", "barrier", "connect", "waiting for", "bootstrap")
#: Earlier finished starts kept for comparisons ("the previous start took 40 s here").
EARLIER_KEPT: Final = 4
#: Characters of a peer-wait line kept as evidence (already redacted by the classifier).
EVIDENCE_CHARS: Final = 120
#: Memory growth in one tick that counts as movement (RSS wobbles by pages at rest).
_MOVED_MEMORY_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class PhaseFigures:
    """One phase's readings summed over its ticks.

    Attributes:
        phase: the phase.
        seconds: time covered by its ticks.
        read_bytes: the tree's block-device reads (page-cache hits are not reads).
        device_read_bytes: reads of the disks the weights sit on, by everyone.
        cpu_seconds: the tree's CPU time.
        download_bytes: bytes the tree wrote while downloading the model.
        gpu_busy_seconds: GPU utilisation integrated over time (0.5 for 1 s at 50 %).
        gpu_seconds: time with a GPU utilisation reading (the mean's denominator).
        memory_grown_bytes: resident plus GPU memory gained over the phase.
        rss_grown_bytes: resident memory gained over the phase.
        peer_lines: log lines that say it waits on other ranks or nodes.
        evidence: the last such line, cut.
        quiet_seconds: time since a tick last saw reads, busy cores or GPU, a download
            or memory growth.
        whole_start: the phase holds a whole start that was over within one tick (a warm
            restart: ``down`` -> ``ready``), its figures the tree's since it began; the
            lifecycle times such a start as ``starting``, though its weights loaded in it too.
    """

    phase: Phase
    seconds: float = 0.0
    read_bytes: int = 0
    device_read_bytes: int = 0
    cpu_seconds: float = 0.0
    download_bytes: int = 0
    gpu_busy_seconds: float = 0.0
    gpu_seconds: float = 0.0
    memory_grown_bytes: int = 0
    rss_grown_bytes: int = 0
    peer_lines: int = 0
    evidence: str | None = None
    quiet_seconds: float = 0.0
    whole_start: bool = False

    @property
    def read_bytes_per_second(self) -> float:
        """Mean tree read rate over the phase."""
        return self.read_bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def cores(self) -> float:
        """Mean CPU cores busy."""
        return self.cpu_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def gpu_ratio(self) -> float | None:
        """Mean GPU utilisation, None without a reading."""
        return self.gpu_busy_seconds / self.gpu_seconds if self.gpu_seconds > 0 else None


@dataclass(frozen=True, slots=True)
class StartFigures:
    """One cold start's phases in the order it passed them; the last one may be running."""

    pid: int
    started_at: float
    phases: tuple[PhaseFigures, ...] = ()
    finished: bool = False

    def seconds_of(self, phase: Phase) -> float | None:
        """Time this start spent in ``phase``, None if it never entered it."""
        times = [f.seconds for f in self.phases if f.phase is phase]
        return sum(times) if times else None


@dataclass(frozen=True, slots=True)
class Reading:
    """The previous tick's cumulative counters, for this tick's differences."""

    at: float
    phase: Phase
    read_bytes: int | None
    device_read_bytes: int | None
    cpu_seconds: float
    download_bytes: int
    memory_bytes: int
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the tick carries per target: the running start, earlier ones, the best rate.

    Attributes:
        current: the start being watched (finished once it is ready or failed).
        earlier: finished starts before it, newest first, at most ``EARLIER_KEPT``.
        best_read_bytes_per_second: the fastest a phase of this target ever read; the
            device the weights sit on showed it can go this fast.
        last: the previous tick's counters.
    """

    current: StartFigures | None = None
    earlier: tuple[StartFigures, ...] = ()
    best_read_bytes_per_second: float | None = None
    last: Reading | None = None


def track(
    bounds: Bounds,
    obs: Observation,
    state: TargetState,
    gpu_ratio: float | None,
    th: BoundThresholds,
) -> Bounds:
    """The bounds after one tick: counters since the last tick go to the tick's phase.

    A start ends (``finished``) at its first tick outside the startup phases. A start the
    lifecycle closed within the tick it was first seen in gets figures of its own all the
    same: one phase from the tree's counters since it began, or none without a process.

    Args:
        bounds: the target's value before the tick.
        obs: the tick's observation (already taken; nothing is read here).
        state: the state the tick stepped to.
        gpu_ratio: mean utilisation of the target's GPUs this tick, None without NVML.
        th: the thresholds, for the best-rate floor.
    """
    p = obs.process
    if p is None and obs.process_error is not None:
        return bounds  # the process source failed this tick: the tree is unseen, not gone
    closed = _closed_unseen(state)
    if p is None or state.create_time is None:
        running = bounds.current is not None and not bounds.current.finished
        bounds = _finished(bounds) if bounds.last is not None else bounds
        if closed is not None and not running:  # a start only its log saw: no figures
            return replace(bounds, current=StartFigures(0, closed.started_at, finished=True))
        return bounds
    reading = Reading(
        obs.at,
        state.phase,
        p.read_bytes,
        obs.disk_read_bytes,
        p.cpu_seconds,
        state.download_bytes,
        p.rss_bytes + (obs.gpu_memory_bytes or 0),
        p.rss_bytes,
    )
    current = bounds.current
    if current is None or current.pid != p.pid:
        bounds = _finished(bounds)
        if state.phase not in STARTUP_PHASES:
            if closed is None:
                return bounds  # a server already up when first seen: no start to explain
            whole = _whole_start(p.pid, closed, reading, obs, gpu_ratio, th)
            return replace(bounds, current=whole, last=reading)
        bounds = replace(bounds, current=StartFigures(p.pid, state.create_time))
        current = bounds.current
    assert current is not None
    last = bounds.last
    if current.finished:
        return bounds  # at rest: the very same value, so nothing downstream is judged again
    if state.phase not in STARTUP_PHASES:
        if last is not None:  # the last stretch ran in the phase the start was still in
            current = _accumulated(
                current, last, replace(reading, phase=last.phase), obs, gpu_ratio, th
            )
        return replace(bounds, current=replace(current, finished=True), last=reading)
    if last is None:
        return replace(bounds, last=reading)
    current = _accumulated(current, last, reading, obs, gpu_ratio, th)
    best = _best(bounds.best_read_bytes_per_second, current.phases[-1], th)
    return replace(bounds, current=current, best_read_bytes_per_second=best, last=reading)


def _closed_unseen(state: TargetState) -> ColdStart | None:
    """The start of the state's own process that the lifecycle closed in this very tick."""
    closed = state.finished_start
    return closed if closed is not None and closed.started_at == state.create_time else None


def _whole_start(
    pid: int,
    closed: ColdStart,
    now: Reading,
    obs: Observation,
    gpu_ratio: float | None,
    th: BoundThresholds,
) -> StartFigures:
    """A start over within one tick: one ``starting`` phase, its tree's counters since it began.

    A new tree's counters count from nothing at its start, so they are the whole start's;
    the host's disk reads before this tick went unseen and count nothing. Its time is the
    lifecycle's (a probe may have seen it ready a tick before the scan found its tree). A
    tree found already exited left no counters: no phase.
    """
    began = closed.started_at
    if obs.process is not None and obs.process.zombie:
        return StartFigures(pid, began, finished=True)
    born = Reading(began, Phase.STARTING, 0, None, 0.0, 0, 0, 0)
    end = replace(now, at=max(began, closed.ended_at), phase=Phase.STARTING)
    start = _accumulated(StartFigures(pid, began), born, end, obs, gpu_ratio, th)
    (f,) = start.phases
    return replace(start, phases=(replace(f, whole_start=True),), finished=True)


def _accumulated(
    start: StartFigures,
    last: Reading,
    now: Reading,
    obs: Observation,
    gpu_ratio: float | None,
    th: BoundThresholds,
) -> StartFigures:
    """``start`` with the counters between ``last`` and ``now`` added to ``now``'s phase.

    The tick's phase, not the previous one: the reads that moved a start into loading are
    the evidence the lifecycle stepped on, so they are loading's.
    """
    phases = start.phases
    if not phases or phases[-1].phase is not now.phase:
        phases = (*phases, PhaseFigures(now.phase))
    f = phases[-1]
    dt = max(0.0, now.at - last.at)
    # a repeated wait line is still a wait: repeats count here, unlike as progress
    peers = [e.text for e in obs.log_events if _waits_on_peers(e.text)]
    read = _grown(last.read_bytes, now.read_bytes)
    cpu = max(0.0, now.cpu_seconds - last.cpu_seconds)
    downloaded = max(0, now.download_bytes - last.download_bytes)
    grown = max(0, now.memory_bytes - last.memory_bytes)
    moved = (
        read >= th.reading_bytes_per_second * dt
        or cpu >= th.busy_cores * dt
        or (gpu_ratio or 0.0) >= th.busy_gpu_ratio
        or downloaded > 0
        or grown >= _MOVED_MEMORY_BYTES
    )
    f = replace(
        f,
        seconds=f.seconds + dt,
        read_bytes=f.read_bytes + read,
        device_read_bytes=f.device_read_bytes
        + _grown(last.device_read_bytes, now.device_read_bytes),
        cpu_seconds=f.cpu_seconds + cpu,
        download_bytes=f.download_bytes + downloaded,
        gpu_busy_seconds=f.gpu_busy_seconds + (gpu_ratio or 0.0) * dt,
        gpu_seconds=f.gpu_seconds + (dt if gpu_ratio is not None else 0.0),
        memory_grown_bytes=f.memory_grown_bytes + grown,
        rss_grown_bytes=f.rss_grown_bytes + max(0, now.rss_bytes - last.rss_bytes),
        peer_lines=f.peer_lines + len(peers),
        evidence=peers[-1][:EVIDENCE_CHARS] if peers else f.evidence,
        quiet_seconds=0.0 if moved else f.quiet_seconds + dt,
    )
    return replace(start, phases=(*phases[:-1], f))


def _waits_on_peers(text: str) -> bool:
    """``PEER_WAIT`` behind a cheap word check: most lines name none of its words."""
    low = text.lower()
    return any(w in low for w in _PEER_WORDS) and PEER_WAIT.search(text) is not None


def _grown(before: int | None, after: int | None) -> int:
    """A cumulative counter's growth; 0 when either is unknown or it went back (a new tree)."""
    if before is None or after is None or after < before:
        return 0
    return after - before


def _best(best: float | None, f: PhaseFigures, th: BoundThresholds) -> float | None:
    if f.read_bytes < th.best_min_bytes:
        return best
    return max(best or 0.0, f.read_bytes_per_second)


def _finished(bounds: Bounds) -> Bounds:
    """The current start moved to the earlier ones (if it got anywhere)."""
    current = bounds.current
    if current is None:
        return bounds if bounds.last is None else replace(bounds, last=None)
    earlier = bounds.earlier
    if current.phases:
        earlier = (replace(current, finished=True), *earlier)[:EARLIER_KEPT]
    return Bounds(None, earlier, bounds.best_read_bytes_per_second, None)


def target_gpu_ratio(
    utilization: Iterable[tuple[int, float | None]], used: Iterable[int]
) -> float | None:
    """Mean utilisation of the GPUs the target holds memory on; None when none reads it.

    Args:
        utilization: (GPU index, utilisation 0-1 or None) for every GPU of the tick.
        used: the indices of the GPUs the target holds memory on.
    """
    mine = set(used)
    values = [u for i, u in utilization if i in mine and u is not None]
    return sum(values) / len(values) if values else None


def bound_of(
    f: PhaseFigures, best: float | None, th: BoundThresholds, *, running: bool = False
) -> Bound:
    """The one bound that explains a phase's figures (the order is the precedence).

    A loading phase that ended after few reads loaded its weights from the page cache; a
    running one says so only once memory grows or cores are busy, else it is idle. A whole
    start over within one tick loaded its weights too: mapped with few reads, from the cache.
    """
    rate = f.read_bytes_per_second
    reading = rate >= th.reading_bytes_per_second and f.read_bytes >= th.reading_bytes
    busy_cpu = f.cores >= th.busy_cores
    gpu = f.gpu_ratio
    busy_gpu = gpu is not None and gpu >= th.busy_gpu_ratio
    if running and f.quiet_seconds >= th.idle_seconds:
        return Bound.PEERS if f.peer_lines else Bound.IDLE
    if f.phase is Phase.DOWNLOADING or f.download_bytes >= th.reading_bytes:
        return Bound.NETWORK if f.download_bytes else Bound.IDLE
    if f.peer_lines and not (reading or busy_gpu):  # NCCL busy-polls a core while it waits
        return Bound.PEERS
    grew = f.memory_grown_bytes >= th.loaded_bytes
    mapped = f.rss_grown_bytes >= th.loaded_bytes
    loads = f.phase is Phase.LOADING or f.whole_start
    if loads and mapped and f.read_bytes < th.cached_share * f.rss_grown_bytes:
        return Bound.PAGE_CACHE
    if reading:
        slower = best is not None and rate < th.near_best_ratio * best
        return Bound.CPU if busy_cpu and slower else Bound.DISK
    moved = grew or busy_cpu or not running
    if f.phase is Phase.LOADING and moved:
        return Bound.PAGE_CACHE
    if busy_gpu and busy_cpu:  # a mixed phase: the resource further past its threshold
        cpu_share, gpu_share = f.cores / th.busy_cores, (gpu or 0.0) / th.busy_gpu_ratio
        return Bound.GPU if gpu_share >= cpu_share else Bound.CPU
    if busy_gpu:
        return Bound.GPU
    if busy_cpu:
        return Bound.CPU
    return Bound.IDLE
