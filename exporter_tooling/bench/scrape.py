"""Section ``scrape``: latency sequential and under concurrent scrapers, CPU and RSS per scrape.

The exporter and node_exporter are scraped the same way, by a client in its own process.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from typing import Final, Literal

from exporter_tooling.bench.context import BenchContext
from exporter_tooling.bench.memory import where_rss_goes
from exporter_tooling.bench.profiling import profile_scrapes
from exporter_tooling.bench.records import (
    LatencySummary,
    MemoryFigures,
    ScrapeSection,
    ScrapeSpec,
    ServerFigures,
)
from exporter_tooling.bench.scrape_client import client_argv
from exporter_tooling.bench.servers import Server, farm_exporter, started
from exporter_tooling.bench.sizes import Sizes
from exporter_tooling.bench.waiting import BenchError

MIB: Final = 2**20


def scrape_section(ctx: BenchContext) -> ScrapeSection:
    """Scrape the exporter watching ``scrape_targets`` trees, then node_exporter."""
    sizes = ctx.sizes
    with farm_exporter(ctx, "scrape", sizes.scrape_targets) as exp:
        time.sleep(2 * sizes.interval)  # a few ticks: steady memory
        ours = _scrape_server(exp, sizes.scrapes, sizes, memory=True)
        if ctx.profile_dir is not None:
            ctx.profiles["scrape"] = profile_scrapes(exp, ctx.profile_dir / "scrape", sizes)
    node = _node_exporter_figures(ctx)
    section: ScrapeSection = {
        "targets": sizes.scrape_targets,
        "gpus": sizes.gpus,
        "exporter": ours,
        "node_exporter": node,
    }
    if "sequential" in node:
        section["node_over_exporter_p50"] = _ratio(node, ours, "p50_ms")
        section["node_over_exporter_p99"] = _ratio(node, ours, "p99_ms")
    return section


def _scrape_server(server: Server, scrapes: int, sizes: Sizes, *, memory: bool) -> ServerFigures:
    """Sequential scrapes (with CPU per scrape and RSS over them), then concurrent ones."""
    rss: list[int] = [server.rss_bytes()]
    cpu0 = server.cpu_seconds()
    spec: ScrapeSpec = {"mode": "sequential", "port": server.port, "count": scrapes}
    sequential = _run_client(spec, watch=lambda: rss.append(server.rss_bytes()))
    rss.append(server.rss_bytes())
    cpu_ms = (server.cpu_seconds() - cpu0) * 1000 / max(1, sequential["count"])
    sequential["cpu_per_scrape_ms"] = round(cpu_ms, 3)
    concurrent = _run_client(
        {
            "mode": "concurrent",
            "port": server.port,
            "scrapers": sizes.scrapers,
            "seconds": sizes.concurrent_seconds,
        }
    )
    concurrent["scrapers"] = sizes.scrapers
    return {
        "sequential": sequential,
        "concurrent": concurrent,
        "memory": _rss_figures(rss, server, scrapes) if memory else {},
        "rss_mib": round(server.rss_bytes() / MIB, 1),
    }


def sequential_scrapes(server: Server, count: int) -> LatencySummary:
    """``count`` sequential scrapes by a client in its own process: their latencies."""
    return _run_client({"mode": "sequential", "port": server.port, "count": count})


def _rss_figures(rss: list[int], server: Server, scrapes: int) -> MemoryFigures:
    """RSS before and after the scrapes; growth is measured past the first tenth (warm-up)."""
    warm = rss[max(1, len(rss) // 10)] if len(rss) > 2 else rss[0]
    return {
        "scrapes": scrapes,
        "rss_after_start_mib": round(rss[0] / MIB, 1),
        "rss_after_scrapes_mib": round(rss[-1] / MIB, 1),
        "rss_max_mib": round(max(rss) / MIB, 1),
        "rss_growth_after_warmup_mib": round((rss[-1] - warm) / MIB, 2),
        "nvml_child_rss_mib": round(server.child_rss_bytes() / MIB, 1),
        "where_rss_goes": where_rss_goes(server),
    }


def _run_client(
    spec: ScrapeSpec, watch: Callable[[], None] | None = None, every: float = 0.5
) -> LatencySummary:
    """Run the scrape client in a child process; call ``watch`` every ``every`` s meanwhile."""
    argv = client_argv(spec)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        while proc.poll() is None:
            if watch is not None:
                watch()
            select.select([proc.stdout.fileno()], [], [], every)
        out = proc.stdout.read()
    if proc.returncode != 0 or not out.strip():
        raise BenchError(f"scrape client failed (exit {proc.returncode})")
    result: LatencySummary = json.loads(out)
    return result


def _node_exporter_figures(ctx: BenchContext) -> ServerFigures:
    path = ctx.node_exporter
    if not os.access(path, os.X_OK):
        return {"error": f"{path} not found (Debian package prometheus-node-exporter)"}
    argv = [path, "--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with started(argv, "node_exporter", ctx.next_dir("node_exporter")) as node:
        node.get("/metrics")  # its first scrape sets collectors up
        return _scrape_server(node, ctx.sizes.node_scrapes, ctx.sizes, memory=False)


def _ratio(
    node: ServerFigures, ours: ServerFigures, key: Literal["p50_ms", "p99_ms"]
) -> float | None:
    a, b = node["sequential"][key], ours["sequential"][key]
    return round(a / b, 1) if a and b else None
