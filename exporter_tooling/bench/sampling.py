"""Section ``sampling``: CPU of the exporter and its NVML child per tick, over numbers of targets.

The exporter ticks unscraped while its CPU is read from /proc; the per-call cost of each
per-target source is measured in this process, through the product's own sources.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from exporter_tooling.bench.context import BenchContext
from exporter_tooling.bench.profiling import py_spy, where_cpu_goes
from exporter_tooling.bench.records import SamplingPoint, SamplingSection
from exporter_tooling.bench.scrape import MIB, sequential_scrapes
from exporter_tooling.bench.servers import Server, farm_exporter

TICK_METRIC = "inference_exporter_tick_duration_seconds"


def sampling_section(ctx: BenchContext) -> SamplingSection:
    """The cost curve over ``sizes.curve`` targets, with three windows at the full size."""
    sizes = ctx.sizes
    counts = sorted(set(sizes.curve) | {sizes.sampling_targets, *sizes.curve_scrape_targets})
    curve = []
    for count in counts:
        if count == sizes.sampling_targets:
            curve.append(_sampling_cost(ctx, count, sizes.sampling_seconds, windows=3))
        else:
            curve.append(_sampling_cost(ctx, count, sizes.curve_seconds, windows=1))
    main = next(p for p in curve if p["targets"] == sizes.sampling_targets)
    # The full-size point's figures head the section; measure adds "seconds" after the rest.
    return {
        **main,  # type: ignore[typeddict-item]
        "curve": curve,
        "per_target_ms": _slope(curve, "cpu_per_tick_ms"),
        "rss_per_target_mib": _slope(curve, "rss_mib"),
        "source_cpu_ms": _source_costs(ctx),
    }


def _source_costs(ctx: BenchContext) -> dict[str, float]:
    """CPU of one call of each per-target source, measured in this process.

    The probe's figure is the calling thread's only (its watchdog thread and the health
    endpoint, which runs here too, are left out): a lower bound of what a probe costs.
    """
    from exporter.config import Target
    from exporter.sources import TargetSeen
    from exporter.sources.disk import DiskSource
    from exporter.sources.probe import Prober
    from exporter.sources.process import ProcessSource

    tree = ctx.farm.targets[0]
    target = Target(
        name=tree.name,
        engine="vllm",
        base_url=ctx.health.url,
        health_path="/health",
        probe_timeout_seconds=0.8,
        pidfile=str(tree.pidfile),
    )
    prober = Prober(target)
    # As the daemon samples it once the core saw the server ready.
    at_rest = functools.partial(ProcessSource(target).sample, seen=TargetSeen(at_rest=True))
    size = len(tree.workers) + 1
    try:
        return {
            f"process tree of {size}": _cpu_per_call(ProcessSource(target).sample),
            f"process tree of {size} at rest, between re-reads": _cpu_per_call(at_rest),
            "health probe": _cpu_per_call(prober.probe_health),
            "host disks": _cpu_per_call(DiskSource().sample),
        }
    finally:
        prober.close()


def _cpu_per_call(call: Callable[[], object], calls: int = 50) -> float:
    call()  # the first call sets up (finds the process, opens files)
    started = time.thread_time()
    for _ in range(calls):
        call()
    return round((time.thread_time() - started) * 1000 / calls, 3)


def _sampling_cost(ctx: BenchContext, targets: int, seconds: float, windows: int) -> SamplingPoint:
    """CPU of the exporter and its NVML child while it ticks unscraped.

    The figure is the median of ``windows`` consecutive windows: other work on a shared box
    only ever adds to a window, and the median keeps one disturbed window out.
    """
    interval = ctx.sizes.interval
    with farm_exporter(ctx, f"sampling-{targets}", targets) as exp:
        time.sleep(2 * interval)  # past the first ticks' one-off work (handles, classifiers)
        measured = [_cpu_window(exp, seconds / windows) for _ in range(windows)]
        tick = metric_value(exp.get("/metrics"), TICK_METRIC)
        rss = exp.rss_bytes()
        p99 = None
        if targets in ctx.sizes.curve_scrape_targets:
            p99 = sequential_scrapes(exp, ctx.sizes.curve_scrapes)["p99_ms"]
        if ctx.profile_dir is not None and targets == ctx.sizes.sampling_targets:
            ctx.profiles["sampling"] = py_spy(exp, ctx.profile_dir / "sampling", seconds)
        # The node-sized point is the one most likely to miss its goal: say where its CPU goes.
        where = (
            where_cpu_goes(exp, ctx.sizes.where_seconds)
            if targets == ctx.sizes.node_targets
            else None
        )
    cpu = statistics.median(m[0] for m in measured)
    child = statistics.median(m[1] for m in measured)
    point: SamplingPoint = {
        "targets": targets,
        "processes": targets * (ctx.sizes.procs_per_target + 1),
        "gpus": ctx.sizes.gpus,
        "interval_s": interval,
        "windows_s": [round(seconds / windows, 1)] * windows,
        "cpu_per_tick_ms": round(cpu * 1000 * interval, 2),
        "cpu_per_tick_ms_windows": [round(m[0] * 1000 * interval, 2) for m in measured],
        "nvml_child_per_tick_ms": round(child * 1000 * interval, 2),
        "cpu_percent_of_core": round(cpu * 100, 2),
        "tick_wall_ms": None if tick is None else round(tick * 1000, 2),
        "rss_mib": round(rss / MIB, 1),
    }
    if p99 is not None:
        point["scrape_p99_ms"] = p99
    if where is not None:
        point["where_cpu_goes"] = where
    return point


def _cpu_window(server: Server, seconds: float) -> tuple[float, float]:
    """CPU seconds per second of the server with its children, and of the children alone."""
    cpu0, child0, t0 = server.cpu_seconds(), server.child_cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    cpu1, child1, t1 = server.cpu_seconds(), server.child_cpu_seconds(), time.monotonic()
    return (cpu1 - cpu0) / (t1 - t0), (child1 - child0) / (t1 - t0)


def metric_value(exposition: bytes, name: str) -> float | None:
    """The value of the unlabelled sample ``name`` in a text exposition; None if absent."""
    for family in text_string_to_metric_families(exposition.decode(errors="replace")):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def _slope(curve: list[SamplingPoint], key: Literal["cpu_per_tick_ms", "rss_mib"]) -> float | None:
    """Least-squares growth of ``key`` per added target."""
    xs = [float(p["targets"]) for p in curve]
    ys = [float(p[key]) for p in curve]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return round(num / sum((x - mx) ** 2 for x in xs), 3)
