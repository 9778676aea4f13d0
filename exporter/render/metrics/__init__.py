"""SnapshotCollector: the latest Snapshot -> Prometheus metric families. No I/O.

A custom collector in the client_python style: fresh families every scrape, built from one
reference to an immutable snapshot. Nothing is registered on the global registry.
Sampling is timer-driven on purpose (lifecycle needs continuous history), so derived gauges
say in their HELP that they describe the last tick, and ``last_tick_timestamp_seconds``
lets an alert catch a stuck loop. The families live by subject: ``host`` (the daemon, its
sources, the host), ``targets`` and ``counters`` (per watched server), ``gpus``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.core.snapshot import Snapshot
from exporter.render.bounds import bound_families
from exporter.render.metrics.gpus import gpu_families, gpu_health_families, mig_families
from exporter.render.metrics.host import build_info, exporter_families, host_families
from exporter.render.metrics.targets import server_families

__all__ = ["SnapshotCollector"]


class SnapshotCollector(Collector):
    """Renders whatever snapshot ``latest()`` returns; before the first tick, only build info."""

    def __init__(self, latest: Callable[[], Snapshot | None], version: str) -> None:
        self._latest = latest
        self._version = version

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family of the latest snapshot."""
        snap = self._latest()
        yield build_info(self._version)
        if snap is None:
            return
        yield from exporter_families(snap)
        yield from server_families(snap.targets)
        yield from bound_families(snap.targets)
        yield from gpu_families(snap)
        yield from mig_families(snap)
        yield from gpu_health_families(snap)
        yield from host_families(snap)
