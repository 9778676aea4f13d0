"""Each phase's bound for ``/status`` and ``/metrics``; built from the snapshot, no I/O.

The per-phase seconds of the last finished start carry the phase's bound as a label, and
the running phase's bound is a state set: one series per bound, 1 for the current one.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.core.advice import PhaseBound
from exporter.core.bounds import Bound
from exporter.core.snapshot import TargetSnapshot
from exporter.render.status_doc import PhaseBoundDoc


def phase_bound_doc(p: PhaseBound) -> PhaseBoundDoc:
    """One phase's verdict as ``/status`` shows it."""
    f = p.figures
    return {
        "phase": f.phase.value,
        "bound": p.bound.value,
        "running": p.running,
        "seconds": f.seconds,
        "advice": p.advice,
        "read_bytes": f.read_bytes,
        "read_bytes_per_second": f.read_bytes_per_second,
        "device_read_bytes": f.device_read_bytes,
        "cpu_cores": f.cores,
        "download_bytes": f.download_bytes,
        "gpu_utilization_ratio": f.gpu_ratio,
        "memory_grown_bytes": f.memory_grown_bytes,
        "resident_grown_bytes": f.rss_grown_bytes,
        "peer_lines": f.peer_lines,
        "best_read_bytes_per_second": p.best_read_bytes_per_second,
        "would_take_seconds": p.would_take_seconds,
    }


def bound_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    """The last finished start's seconds per phase and bound; the running phase's bound."""
    seconds = GaugeMetricFamily(
        "inference_server_cold_start_phase_seconds",
        "Seconds the last finished cold start spent in each startup phase, labelled with "
        "what bounded the phase (disk, page_cache, network, cpu, gpu, peers, idle).",
        labels=["target", "phase", "bound"],
    )
    current = GaugeMetricFamily(
        "inference_server_phase_bound",
        "1 for what bounds the running startup phase, 0 for the other bounds; absent "
        "between starts (as of the last sampling tick).",
        labels=["target", "bound"],
    )
    for t in targets:
        name = t.info.name
        by_phase: dict[tuple[str, str], float] = {}
        for p in t.verdicts.last:
            key = (p.figures.phase.value, p.bound.value)
            by_phase[key] = by_phase.get(key, 0.0) + p.figures.seconds
        for (phase, bound), s in by_phase.items():
            seconds.add_metric([name, phase, bound], s)
        now = t.verdicts.current
        if now is not None:
            for b in Bound:
                current.add_metric([name, b.value], 1.0 if b is now.bound else 0.0)
    yield from (seconds, current)
