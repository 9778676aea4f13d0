"""The daemon's own health, its sources' success, and host-wide evidence (disk, PSI)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.core.snapshot import Snapshot
from exporter.render.metrics.common import TICK_NOTE


def host_families(snap: Snapshot) -> Iterator[Metric]:
    """Host-wide evidence: disk reads and memory pressure, where their sources are up."""
    host = snap.host
    if host.disk is not None:
        disk = CounterMetricFamily(
            "inference_host_disk_read_bytes",
            "Bytes read from whole disks holding the models (partitions excluded); "
            "the evidence the lifecycle used" + TICK_NOTE,
        )
        disk.add_metric([], float(host.disk.read_bytes))
        yield disk
    if host.memory_pressure is not None:
        psi = GaugeMetricFamily(
            "inference_host_memory_pressure_ratio",
            "Share of the last 10 s in which some (or, kind=full, all non-idle) tasks stalled "
            "on memory (Linux PSI); near 1 a host OOM kill is close" + TICK_NOTE,
            labels=["kind"],
        )
        psi.add_metric(["some"], host.memory_pressure.some_ratio)
        psi.add_metric(["full"], host.memory_pressure.full_ratio)
        yield psi


def build_info(version: str) -> Metric:
    """The exporter's version, always there (even before the first tick)."""
    info = GaugeMetricFamily(
        "inference_exporter_build_info", "Exporter version; value is 1.", labels=["version"]
    )
    info.add_metric([version], 1.0)
    return info


def exporter_families(snap: Snapshot) -> Iterator[Metric]:
    """The daemon's own health: last tick, tick cost, and each source's success."""
    tick = GaugeMetricFamily(
        "inference_exporter_last_tick_timestamp_seconds",
        "When the sampling loop last completed a tick; alert if time() minus this grows.",
    )
    tick.add_metric([], snap.taken_at)
    yield tick
    cost = GaugeMetricFamily(
        "inference_exporter_tick_duration_seconds", "Wall time the last sampling tick took."
    )
    cost.add_metric([], snap.tick_duration_seconds)
    yield cost
    overruns = CounterMetricFamily(
        "inference_exporter_tick_overruns",
        "Ticks that took longer than the interval since the exporter started.",
    )
    overruns.add_metric([], float(snap.tick_overruns))
    yield overruns
    if snap.discovery_dropped:  # no family on a host without discovery
        yield _per_source(
            GaugeMetricFamily(
                "inference_exporter_discovery_dropped_targets",
                "Targets discovery found but left out: past max_targets, or a name taken twice.",
                labels=["source"],
            ),
            snap.discovery_dropped,
        )
    up = GaugeMetricFamily(
        "inference_exporter_source_up",
        "1 if the source could observe in the last tick, 0 if it failed; left out while the "
        "source is absent.",
        labels=["source", "target"],
    )
    # Only absent sources get a series: the budget of STYLE.md is nearly spent, and a
    # present source already says so through source_up.
    absent = GaugeMetricFamily(
        "inference_exporter_source_absent",
        "1 while what the source reads is not on this host (no NVIDIA library, no PSI, no "
        "journal): no failure, so it has no source_up; present sources have no series.",
        labels=["source", "target"],
    )
    took = GaugeMetricFamily(
        "inference_exporter_source_duration_seconds",
        "Wall time of the source's call in the last tick.",
        labels=["source", "target"],
    )
    for s in snap.sources:
        key = [s.source, s.target or ""]
        if s.absent:
            absent.add_metric(key, 1.0)
        else:
            up.add_metric(key, 1.0 if s.up else 0.0)
        took.add_metric(key, s.duration_seconds)
    yield up
    yield absent
    yield took
    yield _per_source(
        CounterMetricFamily(
            "inference_exporter_source_errors",
            "Failed source calls since the exporter started.",
            labels=["source"],
        ),
        snap.source_errors,
    )


def _per_source(
    family: GaugeMetricFamily | CounterMetricFamily, counts: tuple[tuple[str, int], ...]
) -> GaugeMetricFamily | CounterMetricFamily:
    """``family`` with one sample per ``(source, count)``."""
    for source, count in counts:
        family.add_metric([source], float(count))
    return family
