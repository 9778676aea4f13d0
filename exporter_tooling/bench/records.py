"""The bench report's records: what each section measures, as it is written to the JSON report.

Typed views of the JSON the bench writes (key order is insertion order, kept as it was); the
table and the goals read the same records back.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class HostFacts(TypedDict):
    """The machine and the run's moment: to read the figures against."""

    date: str
    cpus: int | None
    cpu_model: str
    load_average_before: list[float]
    kernel: str
    python: str
    exporter_version: str
    #: The machine's speed at what sampling does most, to compare runs on different machines:
    #: one read of /proc/self/stat, and one small Python loop, in microseconds.
    proc_read_us: float
    python_loop_us: float
    load_average_after: NotRequired[list[float]]


class LatencySummary(TypedDict):
    """Count, rate and percentiles (milliseconds) of one client's requests."""

    count: int
    errors: int
    seconds: float
    per_second: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    body_bytes: NotRequired[int]
    cpu_per_scrape_ms: NotRequired[float]
    scrapers: NotRequired[int]


class RssBreakdown(TypedDict):
    """Where the exporter's RSS goes: the live process, and its imports in a fresh interpreter."""

    rss_mib: float
    file_backed_mib: float
    anonymous_mib: float
    threads: int
    interpreter_mib: float
    #: What each group of the daemon's imports added, largest libraries by name.
    imports_mib: dict[str, float]
    #: RSS less the interpreter and the imports: what the daemon builds at run time.
    rest_mib: float


class MemoryFigures(TypedDict):
    """The exporter's RSS before, over and after the sequential scrapes."""

    scrapes: int
    rss_after_start_mib: float
    rss_after_scrapes_mib: float
    rss_max_mib: float
    rss_growth_after_warmup_mib: float
    nvml_child_rss_mib: float
    where_rss_goes: NotRequired[RssBreakdown | str]


class ServerFigures(TypedDict, total=False):
    """One server's scrapes (ours or node_exporter's); only ``error`` when it could not run."""

    sequential: LatencySummary
    concurrent: LatencySummary
    memory: MemoryFigures | dict[str, float]
    rss_mib: float
    error: str


class ScrapeSection(TypedDict):
    """Section ``scrape``: our exporter beside node_exporter."""

    targets: int
    gpus: int
    exporter: ServerFigures
    node_exporter: ServerFigures
    node_over_exporter_p50: NotRequired[float | None]
    node_over_exporter_p99: NotRequired[float | None]
    seconds: NotRequired[float]


class SamplingPoint(TypedDict):
    """The sampling cost at one number of targets."""

    targets: int
    processes: int
    gpus: int
    interval_s: float
    windows_s: list[float]
    cpu_per_tick_ms: float
    cpu_per_tick_ms_windows: list[float]
    nvml_child_per_tick_ms: float
    cpu_percent_of_core: float
    tick_wall_ms: float | None
    rss_mib: float
    scrape_p99_ms: NotRequired[float]
    #: Percent of the busy samples per component (py-spy), or why there are none.
    where_cpu_goes: NotRequired[dict[str, float] | str]


class SamplingSection(SamplingPoint):
    """Section ``sampling``: the full-size point, the curve over targets, per-call costs."""

    curve: list[SamplingPoint]
    per_target_ms: float | None
    rss_per_target_mib: float | None
    source_cpu_ms: dict[str, float]
    seconds: NotRequired[float]


class ReadyRun(TypedDict):
    """Ready lags at one interval: simulator ready -> the exporter says ready."""

    interval_s: float
    starts: int
    median_s: float
    max_s: float
    lags_s: list[float]


class StallRun(TypedDict):
    """Stall delays at one interval: the simulator's last progress -> the stall flag."""

    interval_s: float
    threshold_s: float
    limit_s: float
    max_s: float
    delays_s: list[float]


class ReadySection(TypedDict):
    """Section ``ready``."""

    runs: list[ReadyRun]
    seconds: NotRequired[float]


class StallSection(TypedDict):
    """Section ``stall``."""

    runs: list[StallRun]
    seconds: NotRequired[float]


class GoalRecord(TypedDict):
    """One goal as the report writes it (``Goal`` and whether it was met)."""

    name: str
    measured: float | None
    limit: float
    unit: str
    at_most: bool
    met: bool | None


class LogRateRun(TypedDict):
    """One serving target logging a steady rate of access lines."""

    lines_per_s: int
    cpu_percent_of_core: float
    backlog_max_bytes: int


class LogsSection(TypedDict):
    """Section ``logs``: what engine log traffic costs."""

    classifier_access_lines_per_s: float
    #: The first pass in the process: each profile's screens compiled on the way.
    classifier_corpus_first_pass_lines_per_s: float | None
    classifier_corpus_lines_per_s: float | None
    serving: list[LogRateRun]
    fatal_after_flood_ticks: float
    shared_log_targets: int
    shared_log_cpu_percent: float
    seconds: NotRequired[float]


class Report(TypedDict):
    """The whole JSON report."""

    host: HostFacts
    sizes: dict[str, object]
    scrape: NotRequired[ScrapeSection]
    sampling: NotRequired[SamplingSection]
    ready: NotRequired[ReadySection]
    stall: NotRequired[StallSection]
    logs: NotRequired[LogsSection]

    profiles: NotRequired[dict[str, str]]
    seconds: NotRequired[float]
    goals: NotRequired[list[GoalRecord]]
    command: NotRequired[str]


class ScrapeSpec(TypedDict):
    """What the scrape client process is told to do (its one JSON argument)."""

    mode: str  # "sequential" or "concurrent"
    port: int
    count: NotRequired[int]
    scrapers: NotRequired[int]
    seconds: NotRequired[float]
