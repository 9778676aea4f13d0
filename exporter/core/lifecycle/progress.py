"""Progress, stall and ETA: shard bars, download and loader rates, the ratio, the stall flag."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.base.model import STARTUP_PHASES, LogEvent, Observation, Phase
from exporter.core.lifecycle.state import (
    DOWNLOAD_RATE_WEIGHT,
    ETA_MIN_SECONDS,
    ORDER,
    TargetState,
    Thresholds,
    evolve,
)

if TYPE_CHECKING:
    from exporter.core.lifecycle.evidence import Evidence


def is_load_progress(ev: LogEvent) -> bool:
    """Weight-shard progress; other bars (CUDA-graph capture) say initializing, not loading."""
    return ev.progress is not None and ev.phase in (None, Phase.LOADING)


def merge_shards(
    prev: tuple[tuple[str, int, int], ...], events: tuple[LogEvent, ...]
) -> tuple[tuple[str, int, int], ...]:
    """Per progress key, the furthest (done, total) seen: ranks repeat the same bar."""
    if not events:
        return prev
    merged = {k: (d, t) for k, d, t in prev}
    for ev in events:
        if ev.progress is None or not is_load_progress(ev):
            continue
        key = ev.progress_key or "shards"
        done, total = ev.progress
        old = merged.get(key)
        if old is None or total != old[1] or done > old[0]:
            merged[key] = (max(done, old[0]) if old and total == old[1] else done, total)
    return tuple((k, d, t) for k, (d, t) in merged.items())


def track_download(state: TargetState, obs: Observation, ev: Evidence, dt: float) -> TargetState:
    """Bytes written while download files are open, and their rate (smoothed over ticks)."""
    p, base = obs.process, state.baseline.write_bytes
    if "download_bytes" not in ev.kinds or p is None or p.write_bytes is None or base is None:
        if state.phase is Phase.DOWNLOADING and state.download_bytes_per_second:
            return evolve(state, download_bytes_per_second=0.0)  # nothing arrived this tick
        return state
    written = p.write_bytes - base
    rate = written / dt if dt > 0 else None
    old = state.download_bytes_per_second
    if rate is not None and old:
        rate = DOWNLOAD_RATE_WEIGHT * rate + (1 - DOWNLOAD_RATE_WEIGHT) * old
    return evolve(
        state, download_bytes=state.download_bytes + written, download_bytes_per_second=rate
    )


def note_loader(state: TargetState, events: Iterable[LogEvent]) -> TargetState:
    """The loader the newest line names and the newest throughput it reported."""
    loader, rate = state.loader, state.loader_bytes_per_second
    for ev in events:
        loader = ev.loader or loader
        rate = ev.loader_bytes_per_second or rate
    if (loader, rate) == (state.loader, state.loader_bytes_per_second):
        return state
    return evolve(state, loader=loader, loader_bytes_per_second=rate)


def next_progress_ratio(state: TargetState, obs: Observation, th: Thresholds) -> float | None:
    """Shards from logs, else bytes read over the weights' size, else GPU memory vs last peak."""
    if state.phase in (Phase.DOWN, Phase.FAILED):
        return state.progress_ratio
    if ORDER[state.phase] >= ORDER[Phase.INITIALIZING]:
        return 1.0
    ratio: float | None = None
    if state.phase is not Phase.LOADING and not state.shard_progress:
        return state.progress_ratio  # reads and memory before loading are imports, not weights
    if state.shard_progress:
        done = sum(d for _, d, _ in state.shard_progress)
        total = sum(t for _, _, t in state.shard_progress)
        ratio = done / total if total else None
    elif th.weights_bytes and state.load_read_bytes:
        ratio = state.load_read_bytes / th.weights_bytes
    elif th.expected_peak_gpu_bytes and obs.gpu_memory_bytes is not None:
        ratio = obs.gpu_memory_bytes / th.expected_peak_gpu_bytes
    if ratio is None:
        return state.progress_ratio
    ratio = min(1.0, max(0.0, ratio))
    return max(ratio, state.progress_ratio or 0.0)


def estimate_eta(
    state: TargetState, now: float, th: Thresholds, ratio: float | None
) -> float | None:
    """Seconds until ready: from the load rate plus history's init time, else history alone.

    ``ratio``: the progress this tick ends with (``next_progress_ratio``).
    """
    if state.phase not in STARTUP_PHASES or state.create_time is None:
        return None
    expected_init = th.expected_phase_seconds.get(Phase.INITIALIZING)
    elapsed = now - state.phase_since if state.phase_since is not None else 0.0
    # A rate needs a few seconds of loading behind it; before that, history speaks.
    if state.phase is Phase.LOADING and ratio and 0 < ratio < 1 and elapsed >= ETA_MIN_SECONDS:
        remaining_load = elapsed * (1 - ratio) / ratio
        return remaining_load + (expected_init or 0.0)
    expected_total = sum(th.expected_phase_seconds.get(p, 0.0) for p in STARTUP_PHASES)
    if expected_total <= 0:
        return None
    return max(0.0, expected_total - (now - state.create_time))


def stall_verdict(state: TargetState, now: float, th: Thresholds) -> tuple[bool, str | None]:
    """Whether a startup phase has been quiet past its threshold, and the line that says so."""
    if state.phase not in STARTUP_PHASES or state.last_progress_at is None:
        return False, None
    quiet = now - state.last_progress_at
    limit = th.stall_for(state.phase)
    if quiet <= limit:
        return False, None
    return True, (
        f"no progress evidence for {quiet:.0f}s in {state.phase} (threshold "
        f"{limit:.0f}s): disk reads, GPU memory, CPU, processes and logs all quiet"
    )
