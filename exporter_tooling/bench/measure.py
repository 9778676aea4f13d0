"""A bench run: the stand-ins up, the chosen sections in order, the report with its goals."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeVar

from exporter import __version__
from exporter_tooling.bench.context import BenchContext
from exporter_tooling.bench.detection import ready_section, stall_section
from exporter_tooling.bench.goals import evaluate_goals
from exporter_tooling.bench.logs import logs_section
from exporter_tooling.bench.records import (
    HostFacts,
    LogsSection,
    ReadySection,
    Report,
    SamplingSection,
    ScrapeSection,
    StallSection,
)
from exporter_tooling.bench.sampling import sampling_section
from exporter_tooling.bench.scrape import scrape_section
from exporter_tooling.bench.sizes import Sizes
from exporter_tooling.bench.stand_ins import Farm, HealthServer
from exporter_tooling.bench.waiting import BenchError
from exporter_tooling.fakenvml import SimulatedNvmlBuildError, build_simulated_nvml

NODE_EXPORTER: Final = "/usr/bin/prometheus-node-exporter"
Section = TypeVar(
    "Section", ScrapeSection, SamplingSection, ReadySection, StallSection, LogsSection
)


def measure(
    sizes: Sizes,
    sections: Sequence[str],
    work: Path,
    *,
    node_exporter: str = NODE_EXPORTER,
    profile_dir: Path | None = None,
) -> Report:
    """Run ``sections`` and return the report (figures, goals, host facts).

    Args:
        sizes: how long and how big each measurement is.
        sections: which of ``SECTIONS`` to run, in order.
        work: where configs, state and process logs go.
        node_exporter: the binary to compare scrapes with.
        profile_dir: when given, py-spy records the exporter after the measured windows
            (sampling at full size, and under sequential scrapes) into speedscope files here.

    Raises:
        BenchError: a process the run needs did not start or answer.
    """
    started = time.monotonic()
    report: Report = {"host": _host_facts(), "sizes": asdict(sizes)}
    try:
        nvml_dir = build_simulated_nvml(work / "nvml").parent
    except SimulatedNvmlBuildError as exc:
        raise BenchError(f"cannot build the simulated NVML library: {exc}") from exc
    with Farm(work / "farm") as farm, HealthServer() as health:
        farm.start(sizes.farm_targets, sizes.procs_per_target, sizes.host_procs)
        ctx = BenchContext(sizes, work, farm, health, nvml_dir, node_exporter, profile_dir)
        for section in sections:
            _run_section(section, ctx, report)
    if ctx.profiles:
        report["profiles"] = ctx.profiles
    report["host"]["load_average_after"] = list(os.getloadavg())
    report["seconds"] = round(time.monotonic() - started, 1)
    report["goals"] = evaluate_goals(report, sizes)
    return report


def _run_section(name: str, ctx: BenchContext, report: Report) -> None:
    # One branch a section: each section's record has its own type in the report.
    if name == "scrape":
        report["scrape"] = _timed(scrape_section, ctx)
    elif name == "sampling":
        report["sampling"] = _timed(sampling_section, ctx)
    elif name == "ready":
        report["ready"] = _timed(ready_section, ctx)
    elif name == "stall":
        report["stall"] = _timed(stall_section, ctx)
    elif name == "logs":
        report["logs"] = _timed(logs_section, ctx)
    else:
        raise ValueError(f"unknown bench section {name!r}")


def _timed(run: Callable[[BenchContext], Section], ctx: BenchContext) -> Section:
    """Run one section and add the seconds it took to its record."""
    started = time.monotonic()
    section = run(ctx)
    section["seconds"] = round(time.monotonic() - started, 1)
    return section


def _host_facts() -> HostFacts:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average_before": list(os.getloadavg()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "exporter_version": __version__,
        "proc_read_us": _per_call_us(_read_proc_stat),
        "python_loop_us": _per_call_us(_python_loop),
    }


def _per_call_us(call: Callable[[], object], calls: int = 20_000) -> float:
    """Microseconds of CPU one call takes, the best of three rounds (others' load only adds)."""
    rounds = []
    for _ in range(3):
        started = time.thread_time()
        for _ in range(calls):
            call()
        rounds.append((time.thread_time() - started) * 1e6 / calls)
    return round(min(rounds), 3)


def _read_proc_stat() -> bytes:
    with open("/proc/self/stat", "rb") as f:
        return f.read()


def _python_loop() -> int:
    return sum(i * i for i in range(20))


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.machine()
