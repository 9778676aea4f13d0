"""How big each measurement of a bench run is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

SECTIONS: Final = ("scrape", "sampling", "ready", "stall", "logs")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big each measurement is; ``QUICK`` shrinks everything to seconds for a smoke test."""

    procs_per_target: int = 64
    host_procs: int = 500
    gpus: int = 8
    interval: float = 1.0
    scrape_targets: int = 2
    scrapes: int = 100_000
    scrapers: int = 8
    concurrent_seconds: float = 10.0
    node_scrapes: int = 3_000
    sampling_targets: int = 8
    sampling_seconds: float = 30.0
    curve: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
    curve_seconds: float = 15.0
    #: Target counts whose sampling point also measures sequential scrapes (p99).
    curve_scrape_targets: tuple[int, ...] = (8, 64)
    curve_scrapes: int = 3_000
    #: The node the issue sizes for (a MIG node's pods): its point has its own goal.
    node_targets: int = 64
    #: How long py-spy records the node-sized point to say where its CPU goes.
    where_seconds: float = 15.0
    starts: int = 20
    ready_intervals: tuple[float, ...] = (1.0, 0.25)
    stalls: int = 2
    stall_threshold: float = 3.0
    stall_intervals: tuple[float, ...] = (1.0, 0.25)
    #: Serving access lines replayed for the classifier's rate.
    access_lines: int = 50_000
    #: Lines a second one serving target logs, one exporter run each.
    log_rates: tuple[int, ...] = (2_000, 20_000)
    log_seconds: float = 20.0
    #: Seconds of the top rate before the fatal line.
    flood_seconds: float = 60.0
    #: Targets watching one engine and its one log file.
    shared_log_targets: int = 8

    @property
    def farm_targets(self) -> int:
        """Process trees the run needs at most at once."""
        return max(self.scrape_targets, self.sampling_targets, *self.curve)


QUICK: Final = Sizes(
    procs_per_target=4,
    host_procs=20,
    scrapes=300,
    concurrent_seconds=1.0,
    node_scrapes=100,
    sampling_targets=2,
    sampling_seconds=3.0,
    curve=(1, 2),
    curve_seconds=2.0,
    curve_scrape_targets=(2,),
    curve_scrapes=100,
    node_targets=2,
    where_seconds=2.0,
    starts=2,
    ready_intervals=(0.25,),
    stalls=1,
    stall_threshold=1.0,
    stall_intervals=(0.25,),
    access_lines=2_000,
    log_rates=(200,),
    log_seconds=2.0,
    flood_seconds=2.0,
    shared_log_targets=2,
)
