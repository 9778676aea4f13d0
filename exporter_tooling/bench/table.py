"""The report as plain text tables: the goals first, then the main figures of each section."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from exporter_tooling.bench.records import Report, RssBreakdown

_GOAL_COLUMNS: Final = (-58, 10, 10, 5, -12)
_SCRAPE_COLUMNS: Final = (-16, 8, 8, 8, 8, 9, 9, 8)
_SAMPLING_COLUMNS: Final = (-16, 7, 12, 12, 8, 13, 8, 11)


def render_table(report: Report) -> str:
    """The goals and the main figures as plain text tables."""
    host = report["host"]
    lines = [
        f"bench {host['date']}  {host['cpus']} CPUs ({host['cpu_model']})  load average before "
        f"{_loads(host['load_average_before'])}, after {_loads(host.get('load_average_after'))}",
        f"machine speed: one /proc/self/stat read {host.get('proc_read_us')} us, "
        f"a small Python loop {host.get('python_loop_us')} us (compare runs on other machines)",
        "",
        _row(("goal", "measured", "limit", "met", ""), _GOAL_COLUMNS),
    ]
    for g in report.get("goals", []):
        measured = "-" if g["measured"] is None else _figure(g["measured"])
        limit = ("<= " if g["at_most"] else ">= ") + f"{g['limit']:g}"
        met = {True: "yes", False: "NO", None: "-"}[g["met"]]
        lines.append(_row((g["name"], measured, limit, met, g["unit"]), _GOAL_COLUMNS))
    return "\n".join(
        lines + _scrape_lines(report) + _sampling_lines(report) + _detection_lines(report)
    )


def _figure(value: float) -> str:
    """A measured figure as people read it: ``1410570``, not ``1.41057e+06``."""
    return f"{value:.0f}" if abs(value) >= 1e6 else f"{value:g}"


def _row(cells: Sequence[object], widths: Sequence[int]) -> str:
    """Cells padded to ``widths`` (negative: left-aligned)."""
    out = [
        f"{'-' if c is None else c!s:<{-w}}" if w < 0 else f"{'-' if c is None else c!s:>{w}}"
        for c, w in zip(cells, widths, strict=True)
    ]
    return " ".join(out).rstrip()


def _loads(values: list[float] | None) -> str:
    return "-" if not values else "/".join(f"{v:.2f}" for v in values)


def _scrape_lines(report: Report) -> list[str]:
    scrape = report.get("scrape")
    if not scrape:
        return []
    head = ("scrape", "p50 ms", "p99 ms", "max ms", "CPU ms", "8x per s", "8x max", "RSS MiB")
    lines = [
        "",
        f"scrapes with {scrape['targets']} targets and {scrape['gpus']} GPUs; "
        f"8x: {scrape['exporter']['concurrent'].get('scrapers')} concurrent scrapers",
        _row(head, _SCRAPE_COLUMNS),
    ]
    for name, figures in (
        ("exporter", scrape["exporter"]),
        ("node_exporter", scrape["node_exporter"]),
    ):
        if "sequential" not in figures:
            lines.append(f"{name:<16} {figures.get('error', 'not measured')}")
            continue
        seq, conc = figures["sequential"], figures["concurrent"]
        cells = (name, seq["p50_ms"], seq["p99_ms"], seq["max_ms"], seq.get("cpu_per_scrape_ms"))
        lines.append(
            _row((*cells, conc["per_second"], conc["max_ms"], figures["rss_mib"]), _SCRAPE_COLUMNS)
        )
    memory = scrape["exporter"].get("memory")
    if memory:
        lines.append(
            f"exporter RSS MiB: {memory['rss_after_start_mib']} after start, "
            f"{memory['rss_after_scrapes_mib']} after {memory['scrapes']} scrapes "
            f"(max {memory['rss_max_mib']}); its NVML child {memory['nvml_child_rss_mib']}"
        )
        where = memory.get("where_rss_goes")
        if isinstance(where, str | dict):
            lines.append(_rss_line(where))
    return lines


def _rss_line(where: RssBreakdown | str) -> str:
    """Where the RSS goes, MiB: the interpreter, each group of imports, the rest."""
    if isinstance(where, str):
        return f"where the RSS goes: {where}"
    parts = {"interpreter": where["interpreter_mib"], **where["imports_mib"]}
    parts[f"the rest (heap, {where['threads']} threads' stacks)"] = where["rest_mib"]
    shares = {k: f"{v:g}" for k, v in parts.items()}
    return _where_line(
        f"where the RSS goes, MiB ({where['anonymous_mib']:g} anonymous, "
        f"{where['file_backed_mib']:g} file-backed; a library with the standard modules it "
        "is first to import)",
        shares,
    )


def _sampling_lines(report: Report) -> list[str]:
    sampling = report.get("sampling")
    if not sampling:
        return []
    head = ("targets", "procs", "CPU ms/tick", "NVML child", "% core", "tick wall ms")
    head2 = (*head, "RSS MiB", "scrape p99")
    lines = [
        "",
        f"sampling at a {sampling['interval_s']:g} s interval, {sampling['gpus']} GPUs, "
        "CPU of the exporter and its NVML child",
        _row(head2, _SAMPLING_COLUMNS),
    ]
    for p in sampling["curve"]:
        cells = (p["targets"], p["processes"], p["cpu_per_tick_ms"], p["nvml_child_per_tick_ms"])
        tail = (p.get("rss_mib"), p.get("scrape_p99_ms"))
        more = (p["cpu_percent_of_core"], p["tick_wall_ms"], *tail)
        lines.append(_row((*cells, *more), _SAMPLING_COLUMNS))
    lines.append(
        f"per added target: {sampling.get('per_target_ms')} ms CPU a tick, "
        f"{sampling.get('rss_per_target_mib')} MiB RSS"
    )
    costs = ", ".join(f"{k} {v}" for k, v in sampling.get("source_cpu_ms", {}).items())
    lines.append(f"per call, CPU ms (bench process): {costs}")
    for p in sampling["curve"]:
        if "where_cpu_goes" in p:
            lines.append(
                _where_line(f"where the CPU goes at {p['targets']} targets", p["where_cpu_goes"])
            )
    return lines


def _where_line(label: str, shares: dict[str, float] | dict[str, str] | str) -> str:
    """``label``: the shares in order (floats as percent), or why they were not measured."""
    if isinstance(shares, str):
        return f"{label}: {shares}"
    cells = (f"{k} {v:g} %" if isinstance(v, float) else f"{k} {v}" for k, v in shares.items())
    return f"{label}: " + ", ".join(cells)


def _detection_lines(report: Report) -> list[str]:
    ready, stall = report.get("ready"), report.get("stall")
    lines = [
        f"ready lags at a {run['interval_s']:g} s interval, s: {run['lags_s']}"
        for run in (ready["runs"] if ready else [])
    ]
    lines += [
        f"stall delays at a {run['interval_s']:g} s interval, s: {run['delays_s']}"
        for run in (stall["runs"] if stall else [])
    ]
    return ["", *lines] if lines else []
