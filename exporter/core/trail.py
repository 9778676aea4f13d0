"""The movement of a cold start: one point a tick, bounded and packed, for the page's strips.

Pure: a ``Trail`` is built from observations and states passed in. A start keeps at most
``MAX_POINTS`` points: past that, every other point is dropped and the stride doubles, so a
ten-minute start and a two-hour one both draw from about 600 points. Points are packed as
float32 rows in immutable chunks (``ROWS_PER_CHUNK`` each): a snapshot shares them with the
loop, and 600 points of a target on eight GPUs take about 31 KB, not the megabyte that as
many Python objects would.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final

from exporter.base.model import LogClass, Observation
from exporter.core.lifecycle import TargetState

#: Points kept per start before the stride doubles.
MAX_POINTS: Final = 600
#: Marks kept per start (log markers, notable lines), oldest dropped first.
MAX_MARKS: Final = 60
#: A mark's text is for a tooltip: cut short.
MARK_CHARS: Final = 120
#: Rows per packed chunk: appending copies at most this many rows.
ROWS_PER_CHUNK: Final = 64
#: Fixed columns of a row, then one per GPU of the trail: seconds since the process start,
#: read bytes/s, RSS bytes, CPU cores, seconds since progress. NaN: unknown.
COLUMNS: Final = ("t", "read_bytes_per_second", "rss_bytes", "cpu_cores", "quiet_seconds")
#: GPUs drawn per start at most (the first seen, by index).
MAX_GPUS: Final = 16


@dataclass(frozen=True, slots=True)
class TrailMark:
    """Something that happened in a start: a log marker or a notable line."""

    t: float
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class Trail:
    """One start's points, marks and phase bands, aligned at its process start."""

    started_at: float
    pid: int
    #: The GPU indices of the per-GPU columns, fixed by the first point that had any.
    gpus: tuple[int, ...] = ()
    #: Packed float32 rows (``COLUMNS`` then one per GPU), in chunks; the last one open.
    chunks: tuple[bytes, ...] = ()
    count: int = 0
    marks: tuple[TrailMark, ...] = ()
    #: (seconds since the process start, phase) at each phase change: the strips' bands.
    bands: tuple[tuple[float, str], ...] = ()
    #: Ticks per kept point (doubles each time the points are thinned).
    stride: int = 1
    #: Ticks seen since the last kept point.
    pending: int = 0
    #: The last tick's cumulative counters, for rates: (at, read bytes, cpu seconds).
    last: tuple[float, int | None, float] | None = None

    def rows(self) -> Iterator[tuple[float | None, ...]]:
        """Every kept point as (t, read/s, rss, cpu, quiet, gpu...), None where unknown."""
        fmt = _row_format(len(self.gpus))
        for chunk in self.chunks:
            for row in struct.iter_unpack(fmt, chunk):
                yield tuple(None if math.isnan(v) else v for v in row)


@dataclass(frozen=True, slots=True)
class Trails:
    """A target's current start and the one before it."""

    current: Trail | None = None
    previous: Trail | None = None


def follow(
    trails: Trails, obs: Observation, state: TargetState, per_gpu: tuple[tuple[int, int], ...]
) -> Trails:
    """The trails after one tick: a new process begins a new current, the old one kept.

    Args:
        trails: the target's trails before the tick.
        obs: the tick's observation.
        state: the state the tick stepped to.
        per_gpu: the tick's GPU memory of the target, per GPU index.
    """
    p = obs.process
    if p is None or state.create_time is None:
        return trails
    current = trails.current
    if current is None or current.pid != p.pid:
        previous = current if current is not None and current.count else trails.previous
        current = Trail(started_at=state.create_time, pid=p.pid)
        trails = Trails(current=current, previous=previous)
    return replace(trails, current=_extend(current, obs, state, per_gpu))


def _row_format(gpus: int) -> str:
    return f"<{len(COLUMNS) + gpus}f"


def _extend(
    trail: Trail, obs: Observation, state: TargetState, per_gpu: tuple[tuple[int, int], ...]
) -> Trail:
    p = obs.process
    assert p is not None
    now = obs.at
    read_rate = cpu = None
    if trail.last is not None:
        at, read, cpu_seconds = trail.last
        dt = now - at
        if dt > 0:
            if read is not None and p.read_bytes is not None and p.read_bytes >= read:
                read_rate = (p.read_bytes - read) / dt
            cpu = max(0.0, (p.cpu_seconds - cpu_seconds) / dt)
    bands = trail.bands
    if not bands or bands[-1][1] != state.phase.value:
        bands = (*bands, (round(now - trail.started_at, 3), state.phase.value))[-MAX_MARKS:]
    trail = _widened(trail, per_gpu)
    # one copy of the trail a tick: most ticks only move ``last`` and ``pending``
    last, marks = (now, p.read_bytes, p.cpu_seconds), _marked(trail, obs)
    if trail.pending + 1 < trail.stride:
        return replace(trail, pending=trail.pending + 1, last=last, marks=marks, bands=bands)
    gpus = trail.gpus
    held = dict(per_gpu)
    values = (
        now - trail.started_at,
        read_rate,
        p.rss_bytes,
        cpu,
        state.seconds_since_progress,
        *(held.get(i) for i in gpus),
    )
    row = struct.pack(_row_format(len(gpus)), *(math.nan if v is None else v for v in values))
    trail = replace(
        trail,
        chunks=_with_row(trail.chunks, row),
        count=trail.count + 1,
        pending=0,
        last=last,
        marks=marks,
        bands=bands,
    )
    return trail if trail.count <= MAX_POINTS else _thinned(trail, len(row))


def _widened(trail: Trail, per_gpu: tuple[tuple[int, int], ...]) -> Trail:
    """A column for each GPU the target now holds memory on (rows before it: unknown).

    Rare: NVML coming up after the start began, or a worker on one more GPU.
    """
    if all(i in trail.gpus for i, _ in per_gpu):
        return trail  # every tick but those rare ones
    gpus = tuple(sorted({*trail.gpus, *(i for i, _ in per_gpu)}))[:MAX_GPUS]
    if gpus == trail.gpus:
        return trail
    if not trail.count:
        return replace(trail, gpus=gpus)
    old = {i: len(COLUMNS) + k for k, i in enumerate(trail.gpus)}
    fmt = _row_format(len(gpus))
    rows = [
        struct.pack(
            fmt, *row[: len(COLUMNS)], *(row[old[i]] if i in old else math.nan for i in gpus)
        )
        for chunk in trail.chunks
        for row in struct.iter_unpack(_row_format(len(trail.gpus)), chunk)
    ]
    step = ROWS_PER_CHUNK
    chunks = tuple(b"".join(rows[i : i + step]) for i in range(0, len(rows), step))
    return replace(trail, gpus=gpus, chunks=chunks)


def _with_row(chunks: tuple[bytes, ...], row: bytes) -> tuple[bytes, ...]:
    """``chunks`` with ``row`` appended: to the open chunk, or as a new one when it is full."""
    if chunks and len(chunks[-1]) < ROWS_PER_CHUNK * len(row):
        return (*chunks[:-1], chunks[-1] + row)
    return (*chunks, row)


def _thinned(trail: Trail, size: int) -> Trail:
    """Every other point dropped, the stride doubled: the start still fits its budget."""
    packed = b"".join(trail.chunks)
    kept = b"".join(packed[i : i + size] for i in range(0, len(packed), 2 * size))
    step = ROWS_PER_CHUNK * size
    chunks = tuple(kept[i : i + step] for i in range(0, len(kept), step))
    return replace(trail, chunks=chunks, count=len(kept) // size, stride=trail.stride * 2)


def _marked(trail: Trail, obs: Observation) -> tuple[TrailMark, ...]:
    t0 = trail.started_at
    new = [
        TrailMark(round(ev.at - t0, 3), ev.cls.value, ev.text[:MARK_CHARS])
        for ev in obs.log_events
        if ev.cls in (LogClass.MARKER, LogClass.ERROR, LogClass.FATAL) and not ev.repeat
    ]
    if not new:
        return trail.marks
    return (*trail.marks, *new)[-MAX_MARKS:]
