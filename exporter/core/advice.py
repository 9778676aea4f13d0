"""Each phase's bound with its figures and one line a person can act on.

Pure: built from a ``Bounds`` value (``exporter.core.bounds``) and the thresholds; the
earlier starts it carries say what the phase took before and what it would take now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from exporter.base.model import STARTUP_PHASES, GpuSample, Observation
from exporter.base.units import format_bytes, format_duration, format_rate
from exporter.core.bounds import (
    Bound,
    Bounds,
    BoundThresholds,
    PhaseFigures,
    StartFigures,
    bound_of,
    target_gpu_ratio,
    track,
)
from exporter.core.lifecycle import TargetState

#: How an earlier start's phase went, in the comparison sentence.
_HOW: Final = {
    Bound.DISK: "reading the disk",
    Bound.PAGE_CACHE: "from the page cache",
    Bound.NETWORK: "downloading",
    Bound.CPU: "cpu-bound",
    Bound.GPU: "gpu-bound",
    Bound.PEERS: "waiting on peers",
    Bound.IDLE: "idle",
}
#: What a slower phase than before likely means, by (bound now, bound then).
_WHY_SLOWER: Final = {
    (Bound.CPU, Bound.CPU): " (a compile cache miss?)",
    (Bound.DISK, Bound.PAGE_CACHE): " (a cold page cache)",
    (Bound.DISK, Bound.DISK): " (a slower or busier disk?)",
}


@dataclass(frozen=True, slots=True)
class PhaseBound:
    """One phase's verdict.

    Attributes:
        bound: what limited it.
        figures: the readings behind the verdict.
        running: the phase is the current one of a start in progress.
        advice: one line for people, e.g. "loading 9m12s: read 610 GiB at 1.1 GiB/s; ...".
        best_read_bytes_per_second: the device's best rate seen, if any.
        would_take_seconds: what the phase would take at the device's best rate, or as in
            the fastest earlier start; None when neither is faster.
    """

    bound: Bound
    figures: PhaseFigures
    running: bool
    advice: str
    best_read_bytes_per_second: float | None = None
    would_take_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The running start's phases and the last finished start's, each in order.

    ``at`` is the observation time they were judged at, ``phases`` how many phases the
    running start had then (``follow_bounds`` judges again on a new phase at once).
    """

    running: tuple[PhaseBound, ...] = ()
    last: tuple[PhaseBound, ...] = ()
    at: float = 0.0
    phases: int = 0

    @property
    def current(self) -> PhaseBound | None:
        """The running phase's verdict, None between starts."""
        return self.running[-1] if self.running and self.running[-1].running else None


def verdicts(bounds: Bounds, th: BoundThresholds, at: float = 0.0) -> Verdicts:
    """Judge the running start and the newest finished one (at observation time ``at``)."""
    current = bounds.current
    finished = [current] if current is not None and current.finished else []
    starts = [*finished, *bounds.earlier]
    running = current if current is not None and not current.finished else None
    return Verdicts(
        judge(running, tuple(starts), bounds.best_read_bytes_per_second, th) if running else (),
        judge(starts[0], tuple(starts[1:]), bounds.best_read_bytes_per_second, th)
        if starts
        else (),
        at,
        len(running.phases) if running else 0,
    )


def judge(
    start: StartFigures,
    earlier: tuple[StartFigures, ...],
    best: float | None,
    th: BoundThresholds,
) -> tuple[PhaseBound, ...]:
    """Every phase of ``start`` with its bound and advice, compared with ``earlier`` starts."""
    out = []
    for k, f in enumerate(start.phases):
        running = not start.finished and k == len(start.phases) - 1
        bound = bound_of(f, best, th, running=running)
        line, would_take = _advice(f, bound, best, th)
        then = _fastest_earlier(f, earlier, best, th)
        if then is not None and f.seconds >= th.slower_ratio * max(then[0].seconds, 1.0):
            was, how = then
            line += (
                f"; the fastest earlier start took {format_duration(was.seconds)} here, "
                f"{_HOW[how]}{_WHY_SLOWER.get((bound, how), '')}"
            )
            would_take = was.seconds if would_take is None else min(would_take, was.seconds)
        out.append(PhaseBound(bound, f, running, line, best, would_take))
    return tuple(out)


def _fastest_earlier(
    f: PhaseFigures, earlier: tuple[StartFigures, ...], best: float | None, th: BoundThresholds
) -> tuple[PhaseFigures, Bound] | None:
    """The same phase of the earlier start that passed it fastest, with its bound."""
    same = [g for s in earlier for g in s.phases if g.phase is f.phase]
    if not same:
        return None
    fastest = min(same, key=lambda g: g.seconds)
    return fastest, bound_of(fastest, best, th)


def _advice(
    f: PhaseFigures, bound: Bound, best: float | None, th: BoundThresholds
) -> tuple[str, float | None]:
    """The line for ``bound``, and what the phase would take at the disk's best.

    Only a phase that read (disk-bound, or cpu-bound while converting what it read) would
    go faster on a faster disk.
    """
    would_take = None
    if best and f.read_bytes_per_second < th.near_best_ratio * best:
        would_take = f.read_bytes / best
    read = bound is Bound.DISK or (bound is Bound.CPU and f.read_bytes >= th.reading_bytes)
    line = f"{f.phase.value} {format_duration(f.seconds)}: {_said(f, bound, best, would_take, th)}"
    return line, would_take if read else None


def _said(
    f: PhaseFigures,
    bound: Bound,
    best: float | None,
    would_take: float | None,
    th: BoundThresholds,
) -> str:
    """What the figures say of ``bound``, after the line's head."""
    read = f"read {format_bytes(f.read_bytes)} at {format_rate(f.read_bytes_per_second)}"
    best_text = f"this disk's best seen {format_rate(best)}" if best else "no best rate seen yet"
    gpu = f.gpu_ratio
    gpu_text = "GPU not read" if gpu is None else f"GPU {gpu:.0%} busy"
    cores = f"{f.cores:.1f} cores busy"
    if bound is Bound.DISK:
        at_best = f"; at its best this would take {format_duration(would_take)}"
        return f"{read}; {best_text}: disk-bound{at_best if would_take else ''}"
    if bound is Bound.PAGE_CACHE:
        cached = "the weights came from the page cache: a warm start"
        return f"read {format_bytes(f.read_bytes)} from the disk, {cached}"
    if bound is Bound.NETWORK:
        rate = format_rate(f.download_bytes / f.seconds if f.seconds > 0 else None)
        local = "network-bound; a copy of the model on local disk skips this"
        return f"downloaded {format_bytes(f.download_bytes)} at {rate}: {local}"
    if bound is Bound.CPU and f.read_bytes >= th.reading_bytes:
        return f"{read}, below {best_text}, {cores}: cpu-bound (converting weights?)"
    if bound is Bound.CPU:
        return f"{cores}, no reads, {gpu_text}: cpu-bound (compile, JIT, tokenizer or quantisation)"
    if bound is Bound.GPU:
        return f"{gpu_text}, {cores}: gpu-bound (graph capture, warm-up)"
    if bound is Bound.PEERS:
        slowest = "peers-bound; look at the slowest rank or node"
        return f"waiting on other ranks or nodes ({f.evidence}): {slowest}"
    what = f"{cores}, no reads, {gpu_text}"
    if f.quiet_seconds >= th.idle_seconds:
        what = f"nothing busy for {format_duration(f.quiet_seconds)} (reads, cores, GPU)"
    return f"{what}: idle (a lock, a sleep, a hang in the making)"


#: The thresholds the daemon judges with (data; docs/architecture.md says where they come from).
THRESHOLDS: Final = BoundThresholds()
#: A running phase is judged again at most this often (a judgement's words cost about as
#: much as the rest of the target's tick); a new phase or the end of the start at once.
JUDGE_EVERY_SECONDS: Final = 2.0


def follow_bounds(
    bounds: Bounds,
    judged: Verdicts,
    obs: Observation,
    state: TargetState,
    gpus: Iterable[GpuSample],
    per_gpu: Iterable[tuple[int, int]],
) -> tuple[Bounds, Verdicts]:
    """One tick's step: fold the observation in; judge again only when something changed.

    Args:
        bounds: the target's value before the tick.
        judged: the verdicts of ``bounds``.
        obs: the tick's observation.
        state: the state the tick stepped to.
        gpus: the tick's GPU samples (for the utilisation of the target's GPUs).
        per_gpu: the target's memory per GPU index this tick.
    """
    current = bounds.current
    closing = state.finished_start is not None  # a start over within a tick is judged too
    if state.phase not in STARTUP_PHASES and obs.process is not None and not closing:
        at_rest = current is not None and current.finished and current.pid == obs.process.pid
        if at_rest or (current is None and bounds.last is None):
            return bounds, judged  # a server at rest: nothing to fold in, nothing to judge
    ratio = target_gpu_ratio(
        ((g.index, g.utilization_ratio) for g in gpus), (i for i, _ in per_gpu)
    )
    after = track(bounds, obs, state, ratio, THRESHOLDS)
    if after is bounds:
        return bounds, judged
    now = after.current
    if (
        now is not None
        and not now.finished
        and judged.running
        and len(now.phases) == judged.phases
        and obs.at - judged.at < JUDGE_EVERY_SECONDS
    ):
        return after, judged  # the same phase, judged a moment ago: its line still holds
    return after, verdicts(after, THRESHOLDS, obs.at)
