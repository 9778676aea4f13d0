"""Per-target history and counters: cold-start and wake histograms, restarts, failures."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from exporter.base.model import FailureReason, LogClass
from exporter.core.lifecycle import Histogram, observed_load_seconds
from exporter.core.snapshot import TargetSnapshot
from exporter.render.metrics.common import add_if, gauge


def history_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    """Cold-start and wake durations: histograms, the last start and its phases."""
    hist = HistogramMetricFamily(
        "inference_server_cold_start_duration_seconds",
        "Cold-start durations observed by this exporter, from process start to ready.",
        labels=["target"],
    )
    last = gauge(
        "inference_server_last_cold_start_duration_seconds",
        "Duration of the last finished cold start (ready or failed).",
    )
    typical = gauge(
        "inference_server_typical_cold_start_duration_seconds",
        "Median duration of this target's recent successful cold starts (history); absent "
        "until one finished.",
    )
    phases = gauge(
        "inference_server_last_cold_start_phase_duration_seconds",
        "Time the last finished cold start spent in each startup phase.",
        ("target", "phase"),
    )
    wakes = HistogramMetricFamily(
        "inference_server_wake_duration_seconds",
        "Wakes from sleep mode observed by this exporter, from the weights coming back to "
        "awake; never counted as cold starts. Absent for a target until it woke once.",
        labels=["target"],
    )
    load = gauge(
        "inference_server_load_duration_seconds",
        "Weight-load time of the last start as the engine timed it (source=engine) beside the "
        "observed loading phase (source=observed); only for engines that report it.",
        ("target", "source"),
    )
    for t in targets:
        reported = t.state.engine_report.load_seconds if t.state.engine_report else None
        if reported is not None:
            load.add_metric([t.info.name, "engine"], reported)
            observed = observed_load_seconds(t.state)
            if observed is not None:
                load.add_metric([t.info.name, "observed"], observed)
        counted = t.state.counters
        hist.add_metric(
            [t.info.name], _buckets(counted.cold_starts), counted.cold_starts.sum_seconds
        )
        if counted.wakes.count:  # most servers never sleep: no 13 empty series each
            wakes.add_metric([t.info.name], _buckets(counted.wakes), counted.wakes.sum_seconds)
        add_if(typical, t.info.name, t.typical_start_seconds)
        cold = t.state.last_cold_start
        if cold is not None:
            last.add_metric([t.info.name], cold.duration_seconds)
            for phase, seconds in cold.phase_seconds:
                phases.add_metric([t.info.name, phase.value], seconds)
    yield from (hist, wakes, last, typical, phases, load)


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, n in zip((*hist.bounds, float("inf")), hist.bucket_counts, strict=True):
        running += n
        out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
    return out


def counter_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    """Restarts, start failures by reason, deaths and log lines by class."""
    restarts = CounterMetricFamily(
        "inference_server_restarts",
        "New server processes seen after the first (restarts).",
        labels=["target"],
    )
    failures = CounterMetricFamily(
        "inference_server_start_failures",
        "Cold starts that ended without becoming ready, by reason.",
        labels=["target", "reason"],
    )
    deaths = CounterMetricFamily(  # reasons seen only: all from the start would break the budget
        "inference_server_deaths",
        "Server processes that ended after ready, by the fatal line's reason, else exited.",
        labels=["target", "reason"],
    )
    lines = CounterMetricFamily(
        "inference_server_log_lines",
        "Engine log lines read, by class (benign = known startup noise).",
        labels=["target", "class"],
    )
    for t in targets:
        c, name = t.state.counters, t.info.name
        restarts.add_metric([name], float(c.restarts))
        fails = dict(c.start_failures)
        for reason in FailureReason:
            failures.add_metric([name, reason.value], float(fails.get(reason, 0)))
        for reason, n in c.deaths:
            deaths.add_metric([name, reason.value], float(n))
        counts = dict(c.log_lines)
        for cls in LogClass:
            lines.add_metric([name, cls.value], float(counts.get(cls, 0)))
    yield from (restarts, failures, deaths, lines)
