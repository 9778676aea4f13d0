"""The goals of the performance issue, judged against a report's figures."""

from __future__ import annotations

from dataclasses import dataclass

from exporter_tooling.bench.records import (
    GoalRecord,
    LogsSection,
    ReadySection,
    Report,
    SamplingSection,
    ScrapeSection,
    ServerFigures,
    StallSection,
)
from exporter_tooling.bench.sizes import Sizes


@dataclass(frozen=True, slots=True)
class Goal:
    """One goal of the performance issue and how this run did against it."""

    name: str
    measured: float | None
    limit: float
    unit: str
    at_most: bool = True

    @property
    def met(self) -> bool | None:
        """Whether the measurement is within the limit; None when it was not measured."""
        if self.measured is None:
            return None
        return self.measured <= self.limit if self.at_most else self.measured >= self.limit

    def record(self) -> GoalRecord:
        """The goal as the report writes it."""
        return {
            "name": self.name,
            "measured": self.measured,
            "limit": self.limit,
            "unit": self.unit,
            "at_most": self.at_most,
            "met": self.met,
        }


def evaluate_goals(report: Report, sizes: Sizes) -> list[GoalRecord]:
    """The goals of the issue against this report's figures (those of skipped sections: None)."""
    goals = _scrape_goals(report.get("scrape")) + _sampling_goals(report.get("sampling"), sizes)
    goals += _detection_goals(report.get("ready"), report.get("stall"))
    goals += _logs_goals(report.get("logs"))
    return [g.record() for g in goals]


def _logs_goals(logs: LogsSection | None) -> list[Goal]:
    """Issue 29's goals: the classifier at line rate, serving traffic almost free."""
    if logs is None:
        return []
    goals = [
        Goal(
            "classifier, serving access lines",
            logs["classifier_access_lines_per_s"],
            250_000,
            "lines/s",
            at_most=False,
        ),
        Goal(
            "classifier, the shared corpus",
            logs["classifier_corpus_lines_per_s"],
            50_000,
            "lines/s",
            at_most=False,
        ),
    ]
    for run in logs["serving"]:
        limit = 1.0 if run["lines_per_s"] <= 2_000 else 5.0
        name = f"one target logging {run['lines_per_s']:,} lines/s, exporter CPU"
        if not run["lines_per_s"]:
            name = "one target, its log quiet (the baseline), exporter CPU"
        goals.append(Goal(name, run["cpu_percent_of_core"], limit, "% of a core"))
        if run["lines_per_s"]:
            name = f"one target logging {run['lines_per_s']:,} lines/s, backlog"
            goals.append(Goal(name, run["backlog_max_bytes"], 0, "bytes"))
    goals.append(
        Goal(
            "a fatal line after the flood, seen after",
            logs["fatal_after_flood_ticks"],
            1.0,
            "ticks",
        )
    )
    name = f"{logs['shared_log_targets']} targets on one engine and one log, exporter CPU"
    goals.append(Goal(name, logs["shared_log_cpu_percent"], 1.0, "% of a core"))
    return goals


def _scrape_goals(scrape: ScrapeSection | None) -> list[Goal]:
    # Read part by part: a run may have skipped the section or failed to measure a part of it.
    ours: ServerFigures = scrape["exporter"] if scrape else {}
    seq, conc = ours.get("sequential"), ours.get("concurrent")
    memory = ours.get("memory") or {}
    return [
        Goal("scrape p99, sequential", seq.get("p99_ms") if seq else None, 1.0, "ms"),
        Goal(
            "node_exporter p50 / ours (times faster)",
            scrape.get("node_over_exporter_p50") if scrape else None,
            5.0,
            "x",
            at_most=False,
        ),
        Goal(
            "slowest scrape, concurrent scrapers", conc.get("max_ms") if conc else None, 100, "ms"
        ),
        Goal("RSS after the scrapes", memory.get("rss_max_mib"), 40.0, "MiB"),
        Goal("RSS growth over the scrapes", memory.get("rss_growth_after_warmup_mib"), 1.0, "MiB"),
    ]


def _sampling_goals(sampling: SamplingSection | None, sizes: Sizes) -> list[Goal]:
    measured = sampling.get("cpu_percent_of_core") if sampling else None
    name = f"sampling CPU, {sizes.sampling_targets} targets x {sizes.procs_per_target} processes"
    curve = {p["targets"]: p for p in sampling["curve"]} if sampling else {}
    node = curve.get(sizes.node_targets)
    goals = [
        Goal(
            "sampling CPU per added target (slope of the curve)",
            sampling.get("per_target_ms") if sampling else None,
            0.5,
            "ms a tick",
        ),
        Goal(name, measured, 1.0, "% of a core"),
        Goal(
            f"sampling CPU, {sizes.node_targets} targets",
            node["cpu_percent_of_core"] if node else None,
            3.0,
            "% of a core",
        ),
        Goal(
            "RSS growth per added target (slope of the curve)",
            sampling.get("rss_per_target_mib") if sampling else None,
            0.3,
            "MiB",
        ),
    ]
    for count in sizes.curve_scrape_targets:
        point = curve.get(count)
        limit = 1.0 if count <= sizes.sampling_targets else 3.0
        p99 = point.get("scrape_p99_ms") if point else None
        goals.append(Goal(f"scrape p99, sequential, {count} targets", p99, limit, "ms"))
    return goals


def _detection_goals(ready: ReadySection | None, stall: StallSection | None) -> list[Goal]:
    goals = []
    for run in ready["runs"] if ready else []:
        interval = run["interval_s"]
        goals.append(
            Goal(f"ready lag median, interval {interval:g}s", run["median_s"], interval, "s")
        )
        goals.append(Goal(f"ready lag max, interval {interval:g}s", run["max_s"], interval, "s"))
    for stall_run in stall["runs"] if stall else []:
        name = (
            f"stall flag after hang, threshold {stall_run['threshold_s']:g}s"
            f" + 2 x {stall_run['interval_s']:g}s"
        )
        goals.append(Goal(name, stall_run["max_s"], stall_run["limit_s"], "s"))
    return goals
