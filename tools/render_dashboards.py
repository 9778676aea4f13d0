"""Renders grafana/*.json from code with grafana-foundation-sdk; run it after editing a panel.

Dashboards as code because both dashboards repeat one selector and one phase encoding in
dozens of queries, and the SDK's typed builders (generated from Grafana's own schema) catch a
misspelt field before Grafana does. The JSON stays committed: it is what operators import.
Usage: python tools/render_dashboards.py [--check]  (--check: exit 1 if a file is stale).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TypeVar

from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

ROOT: Final = Path(__file__).resolve().parents[1]
DATASOURCE: Final = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG: Final = "inference-lifecycle"
#: Lifecycle phases in DESIGN.md order, with the colour each gets in state timelines.
PHASES: Final = (
    ("down", "text"),
    ("starting", "blue"),
    ("downloading", "light-blue"),
    ("loading", "purple"),
    ("initializing", "yellow"),
    ("ready", "green"),
    ("serving", "dark-green"),
    ("sleeping", "super-light-green"),
    ("degraded", "orange"),
    ("failed", "red"),
)
STARTUP: Final = "starting|downloading|loading|initializing"
# Cold start: one host and one target. Fleet: any of them, narrowed by deployment via the join.
ONE: Final = 'instance="$instance",target="$target"'
HOST: Final = 'instance="$instance"'
MANY: Final = 'instance=~"$instance",target=~"$target"'
IN_DEPLOYMENT: Final = (
    " * on (job, instance, target) group_left (deployment, model) inference_server_info{"
    + MANY
    + ',deployment=~"$deployment"}'
)

Panel = Builder[model.Panel]
P = TypeVar("P", bound=Panel)


def query(expr: str, legend: str = "", *, instant: bool = False) -> prom.Dataquery:
    """One Prometheus query on the dashboard's datasource variable."""
    q = prom.Dataquery().expr(expr).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def _with_queries(panel: P, queries: Sequence[prom.Dataquery]) -> P:
    for ref, q in zip("ABCDEFGH", queries, strict=False):
        panel.with_target(q.ref_id(ref))  # type: ignore[attr-defined]
    return panel


def series(
    title: str, unit: str, *queries: prom.Dataquery, desc: str = "", w: int = 12
) -> timeseries.Panel:
    """A time-series panel."""
    p = timeseries.Panel().title(title).description(desc).unit(unit).datasource(DATASOURCE)
    p = p.height(8).span(w).fill_opacity(10).line_width(1)
    return _with_queries(p, queries)


def single(title: str, unit: str, q: prom.Dataquery, *, desc: str = "", w: int = 4) -> stat.Panel:
    """A stat panel showing the last value."""
    p = stat.Panel().title(title).description(desc).unit(unit).datasource(DATASOURCE)
    p = p.height(4).span(w).graph_mode(common.BigValueGraphMode.NONE)
    p = p.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    return _with_queries(p, [q])


def mapping(*pairs: tuple[int, str, str]) -> list[model.ValueMapping]:
    """Value mappings: number -> (text, colour)."""
    options = {
        str(v): model.ValueMappingResult(text=text, color=color, index=i)
        for i, (v, text, color) in enumerate(pairs)
    }
    return [model.ValueMap(options=options)]


PHASE_MAPPING: Final = mapping(*((i, name, color) for i, (name, color) in enumerate(PHASES)))
FLAG_MAPPING: Final = mapping((0, "no", "green"), (1, "STALLED", "red"))


def phase_code(selector: str) -> str:
    """One series per target whose value is the phase's index in PHASES (mapped back to names)."""
    parts = [
        f'(inference_server_phase{{{selector},phase="{name}"}} == 1) * {i}'
        for i, (name, _) in enumerate(PHASES)
    ]
    return "max without (phase) (\n  " + "\n  or ".join(parts) + "\n)"


def timeline(
    title: str,
    q: prom.Dataquery,
    maps: list[model.ValueMapping],
    *,
    desc: str = "",
    w: int = 24,
    h: int = 5,
) -> statetimeline.Panel:
    """A state timeline: one row per series, coloured by value mapping."""
    p = statetimeline.Panel().title(title).description(desc).datasource(DATASOURCE)
    p = p.height(h).span(w).mappings(maps).merge_values(True).show_value(common.VisibilityMode.AUTO)
    p = p.legend(
        VizLegendOptions()
        .show_legend(False)
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
    )
    return _with_queries(p, [q])


def bars(
    title: str, unit: str, *queries: prom.Dataquery, desc: str = "", w: int = 12
) -> bargauge.Panel:
    """A horizontal bar gauge of instant values."""
    p = bargauge.Panel().title(title).description(desc).unit(unit).datasource(DATASOURCE)
    p = p.height(8).span(w).orientation(common.VizOrientation.HORIZONTAL)
    p = p.display_mode(common.BarGaugeDisplayMode.BASIC)
    p = p.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    return _with_queries(p, queries)


def variables(*, multi: bool) -> list[Builder[model.VariableModel]]:
    """Datasource, deployment, instance and target; the fleet view selects many at once."""
    info = "inference_server_info"

    def labels(name: str, label: str, expr: str, *, all_ok: bool) -> dash.QueryVariable:
        v = dash.QueryVariable(name).label(label).datasource(DATASOURCE)
        v = v.query(f"label_values({expr}, {name})")
        v = v.refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(
            model.VariableSort.ALPHABETICAL_ASC
        )
        return v.multi(multi).include_all(all_ok).all_value(".*") if all_ok else v.multi(False)

    return [
        dash.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        labels("deployment", "Deployment", info, all_ok=True),
        labels("instance", "Host", f'{info}{{deployment=~"$deployment"}}', all_ok=multi),
        labels(
            "target",
            "Target",
            f'{info}{{instance=~"$instance",deployment=~"$deployment"}}',
            all_ok=multi,
        ),
    ]


def frame(title: str, uid: str, description: str, *, multi: bool) -> dash.Dashboard:
    """A dashboard with the shared variables, tags and a link to its sibling."""
    d = dash.Dashboard(title).uid(uid).description(description).tags([TAG])
    d = d.refresh("10s").time("now-1h", "now").timezone("browser").editable()
    d = d.tooltip(model.DashboardCursorSync.CROSSHAIR).variables(variables(multi=multi))
    alerts = dash.AnnotationQuery().name("Inference alerts").datasource(DATASOURCE).enable(True)
    d = d.annotation(
        alerts.icon_color("red").expr(
            'ALERTS{alertstate="firing",alertname=~"Inference.*",instance=~"$instance"}'
        )
    )
    link = dash.DashboardLink("Inference dashboards").type(model.DashboardLinkType.DASHBOARDS)
    return d.link(link.tags([TAG]).as_dropdown(False).include_vars(True).keep_time(True))


def with_rows(d: dash.Dashboard, *rows: tuple[str, list[Panel]]) -> dash.Dashboard:
    """Add each row and its panels; the SDK lays them out left to right, top to bottom."""
    for title, panels in rows:
        d = d.with_row(dash.Row(title))
        for panel in panels:
            d = d.with_panel(panel)
    return d


def cold_start() -> dash.Dashboard:
    """One host and target through its cold start."""
    d = frame(
        "Inference cold start",
        "inference-cold-start",
        "One inference server's cold start: phase, progress, evidence, probes and history.",
        multi=False,
    )
    return with_rows(
        d,
        ("Now", _cold_start_now()),
        ("Cold start", _cold_start_progress()),
        ("Evidence", _cold_start_evidence()),
        ("GPU health", _gpu_health()),
        ("Probes, logs and history", _cold_start_probes()),
    )


def _healthy_zero(metric: str) -> str:
    """A health series, or 0 for each GPU that does not export it (a healthy one, by default)."""
    return f"{metric}{{{HOST}}} or on (gpu) (0 * inference_gpu_up{{{HOST}}})"


def _gpu_health() -> list[Panel]:
    """The host's GPUs: the hardware events that fail a start (reason gpu_error) and slow ones."""
    return [
        bars(
            "Xid errors in range",
            "none",
            query(
                f"sum by (gpu, xid) (increase(inference_gpu_xid_errors_total{{{HOST}}}[$__range]))"
                f" or on (gpu) sum by (gpu) (0 * inference_gpu_up{{{HOST}}})",
                "GPU {{gpu}} Xid {{xid}}",
                instant=True,
            ),
        ),
        series(
            "ECC and row remaps",
            "short",
            query(
                _healthy_zero("inference_gpu_ecc_uncorrected_volatile_errors_total"),
                "GPU {{gpu}} uncorrectable ECC",
            ),
            query(
                _healthy_zero("inference_gpu_remapped_rows_pending"), "GPU {{gpu}} remap pending"
            ),
            query(_healthy_zero("inference_gpu_remapped_rows_failed"), "GPU {{gpu}} remap failed"),
            query(
                _healthy_zero("inference_gpu_retired_pages_pending"),
                "GPU {{gpu}} retirement pending",
            ),
            desc="Pending: a GPU reset makes the repair take effect. Failed: replace the GPU. "
            "By default these series exist only while they show a problem (0 otherwise).",
        ),
        series(
            "GPUs throttled, by reason",
            "short",
            query(
                f"sum by (reason) (inference_gpu_clock_throttle_active{{{HOST}}})"
                ' or label_replace(vector(0), "reason", "none", "", "")',
                "{{reason}}",
            ),
            desc="Power brake or hardware slowdown during a load makes it slow, not stalled.",
        ),
        series(
            "PCIe link width of max",
            "percentunit",
            query(
                f"inference_gpu_pcie_link_width{{{HOST}}} / inference_gpu_pcie_link_width_max"
                f" or on (gpu) (1 + 0 * inference_gpu_up{{{HOST}}})",
                "GPU {{gpu}}",
            ),
            desc="Under 100 %: the link trained narrower (a bad slot or riser), so weights load "
            "slower.",
        ),
    ]


def _cold_start_now() -> list[Panel]:
    background = common.BigValueColorMode.BACKGROUND
    return [
        single("Phase", "none", query(phase_code(ONE), instant=True), w=4)
        .mappings(PHASE_MAPPING)
        .color_mode(background),
        single("Stalled", "none", query(f"inference_server_stalled{{{ONE}}}"), w=3)
        .mappings(FLAG_MAPPING)
        .color_mode(background),
        single("Ready", "none", query(f"inference_server_ready{{{ONE}}}"), w=3).mappings(
            mapping((0, "no", "text"), (1, "READY", "green"))
        ),
        single(
            "Load progress", "percentunit", query(f"inference_server_load_progress_ratio{{{ONE}}}")
        ),
        single(
            "ETA",
            "s",
            query(f"inference_server_eta_seconds{{{ONE}}}"),
            w=3,
            desc="From the load rate and this target's past starts; absent when unknown.",
        ),
        single(
            "This start so far",
            "s",
            query(f"time() - inference_server_process_start_time_seconds{{{ONE}}}"),
            desc="Since the engine's main process started (survives exporter restarts).",
        ),
        single(
            "Last cold start",
            "s",
            query(f"inference_server_last_cold_start_duration_seconds{{{ONE}}}"),
            w=3,
        ),
    ]


def _cold_start_progress() -> list[Panel]:
    return [
        timeline("Phase", query(phase_code(ONE), "phase"), PHASE_MAPPING, h=4),
        series(
            "Load progress",
            "percentunit",
            query(f"inference_server_load_progress_ratio{{{ONE}}}", "progress"),
            w=8,
            desc="Shard counts from the log, else bytes read or GPU memory against the model.",
        )
        .min(0)
        .max(1),
        series("ETA", "s", query(f"inference_server_eta_seconds{{{ONE}}}", "ETA"), w=8),
        series(
            "Time since progress evidence",
            "s",
            query(
                f"time() - inference_server_last_progress_timestamp_seconds{{{ONE}}}", "quiet for"
            ),
            w=8,
            desc="Disk reads, GPU memory, log lines, CPU time and new processes count as "
            "progress; GPU utilisation does not. Stalled once this passes the phase's "
            "threshold.",
        ),
        timeline(
            "Stall flag", query(f"inference_server_stalled{{{ONE}}}", "stalled"), FLAG_MAPPING, h=3
        ),
    ]


def _cold_start_evidence() -> list[Panel]:
    return [
        series(
            "GPU memory per GPU",
            "bytes",
            query(f"inference_server_gpu_memory_used_bytes{{{ONE}}}", "GPU {{gpu}} this server"),
            query(f"inference_gpu_memory_used_bytes{{{HOST}}}", "GPU {{gpu}} used"),
            query(f"inference_gpu_foreign_memory_used_bytes{{{HOST}}}", "GPU {{gpu}} foreign"),
            desc="Foreign: held by processes of no watched server, e.g. an engine auto-started "
            "at boot.",
        ),
        series(
            "PCIe and disk read throughput",
            "Bps",
            query(
                f"rate(inference_server_process_read_bytes_total{{{ONE}}}[$__rate_interval])",
                "engine reads",
            ),
            query(
                f"rate(inference_host_disk_read_bytes_total{{{HOST}}}[$__rate_interval])",
                "host disks",
            ),
            query(f"inference_gpu_pcie_rx_bytes_per_second{{{HOST}}}", "GPU {{gpu}} PCIe RX"),
        ),
        series(
            "Resident memory",
            "bytes",
            query(f"inference_server_process_resident_memory_bytes{{{ONE}}}", "RSS"),
            w=8,
        ),
        series(
            "CPU",
            "short",
            query(
                f"rate(inference_server_process_cpu_seconds_total{{{ONE}}}[$__rate_interval])",
                "cores",
            ),
            query(f"inference_server_processes{{{ONE}}}", "processes"),
            w=8,
        ),
        series(
            "GPU utilisation",
            "percentunit",
            query(f"inference_gpu_utilization_ratio{{{HOST}}}", "GPU {{gpu}}"),
            w=8,
            desc="Never progress evidence on its own: an NCCL hang can show 100 %.",
        ),
    ]


def _cold_start_probes() -> list[Panel]:
    return [
        series(
            "Probe latency",
            "s",
            query(f"inference_server_probe_duration_seconds{{{ONE}}}", "{{probe}}"),
            w=8,
        ),
        timeline(
            "Probe outcome",
            query(f"inference_server_probe_success{{{ONE}}}", "{{probe}}"),
            mapping((0, "fail", "red"), (1, "ok", "green")),
            w=8,
            h=8,
        ),
        series(
            "Notable log lines",
            "short",
            query(
                f"sum by (class) (increase(inference_server_log_lines_total{{{ONE},"
                f'class!="info"}}[$__rate_interval]))',
                "{{class}}",
            ),
            w=8,
            desc="Benign: known startup noise (e.g. CUTE_DSL packing errors). Fatal ends "
            "the start.",
        ).draw_style(common.GraphDrawStyle.BARS),
        series(
            "This start against previous starts",
            "s",
            query(
                f"time() - inference_server_process_start_time_seconds{{{ONE}}}",
                "this start so far",
            ),
            query(f"inference_server_last_cold_start_duration_seconds{{{ONE}}}", "last start"),
            query(
                f"inference_server_cold_start_duration_seconds_sum{{{ONE}}}"
                f" / (inference_server_cold_start_duration_seconds_count{{{ONE}}} > 0)",
                "mean of starts seen",
            ),
        ),
        bars(
            "Last cold start by phase",
            "s",
            query(
                f"inference_server_last_cold_start_phase_duration_seconds{{{ONE}}}",
                "{{phase}}",
                instant=True,
            ),
        ),
    ]


def fleet() -> dash.Dashboard:
    """Every target: phases, trouble now, cold-start durations, restarts."""
    d = frame(
        "Inference fleet",
        "inference-fleet",
        "Every watched inference server: phases, stalls and failures now, cold-start "
        "durations by deployment and model, restarts.",
        multi=True,
    )
    return with_rows(
        d,
        ("Now", _fleet_now()),
        ("Cold starts", _fleet_cold_starts()),
        ("Restarts, failures and alerts", _fleet_trouble()),
    )


def _fleet_now() -> list[Panel]:
    counts = [
        ("Targets", f'count(inference_server_info{{{MANY},deployment=~"$deployment"}})'),
        ("Ready", f"sum(inference_server_ready{{{MANY}}}{IN_DEPLOYMENT})"),
        ("Stalled now", f"sum(inference_server_stalled{{{MANY}}}{IN_DEPLOYMENT})"),
        ("Failed now", f'sum(inference_server_phase{{{MANY},phase="failed"}}{IN_DEPLOYMENT})'),
        ("Degraded now", f'sum(inference_server_phase{{{MANY},phase="degraded"}}{IN_DEPLOYMENT})'),
    ]
    return [
        *(single(title, "none", query(expr)) for title, expr in counts),
        single(
            "Sources down",
            "none",
            query('count(inference_exporter_source_up{instance=~"$instance"} == 0) or vector(0)'),
            desc="Exporter sources (process, nvml, disk, logs, probe, history) failing now.",
        ),
        bars(
            "Targets by phase",
            "none",
            query(
                f"sum by (phase) (inference_server_phase{{{MANY}}}{IN_DEPLOYMENT})",
                "{{phase}}",
                instant=True,
            ),
            w=8,
        ),
        timeline(
            "Phase by target",
            query(phase_code(MANY) + IN_DEPLOYMENT, "{{instance}} {{target}}"),
            PHASE_MAPPING,
            w=16,
            h=8,
        ),
        timeline(
            "Stalled by target",
            query(f"inference_server_stalled{{{MANY}}}{IN_DEPLOYMENT}", "{{instance}} {{target}}"),
            FLAG_MAPPING,
            h=6,
        ),
    ]


def _quantile(q: float) -> prom.Dataquery:
    buckets = f"increase(inference_server_cold_start_duration_seconds_bucket{{{MANY}}}[$__range])"
    expr = f"histogram_quantile({q}, sum by (le, deployment, model) ({buckets}{IN_DEPLOYMENT}))"
    return query(expr, f"p{round(q * 100)} {{{{deployment}}}} {{{{model}}}}", instant=True)


def _fleet_cold_starts() -> list[Panel]:
    return [
        bars(
            "Cold-start duration p50 / p95 by deployment and model",
            "s",
            _quantile(0.5),
            _quantile(0.95),
            desc="Over the dashboard's time range, from the exporter's histogram.",
        ),
        bars(
            "Last cold start by target",
            "s",
            query(
                f"inference_server_last_cold_start_duration_seconds{{{MANY}}}{IN_DEPLOYMENT}",
                "{{instance}} {{target}}",
                instant=True,
            ),
        ),
        bars(
            "What bounded the last start, by model and phase",
            "s",
            query(
                "model_phase_bound:inference_server_cold_start_phase_seconds:max"
                '{deployment=~"$deployment"}',
                "{{model}} {{phase}}: {{bound}}",
                instant=True,
            ),
            desc="Recording rule in deploy/prometheus/rules.yml: the slowest phase of each "
            "model's last starts with what bounded it (disk, page_cache, network, cpu, gpu, "
            "peers, idle): models that start cpu-bound stand out.",
        ),
        bars(
            "Disk-bound loads by host",
            "s",
            query(
                'instance:inference_server_disk_bound_load_seconds:max{instance=~"$instance"}',
                "{{instance}}",
                instant=True,
            ),
            desc="Recording rule in deploy/prometheus/rules.yml: each host's longest loading "
            "phase that read at its disk's best rate; the slowest disks lead.",
        ),
        series(
            "Deployment readiness",
            "percentunit",
            query(
                'deployment:inference_server_ready:ratio{deployment=~"$deployment"}',
                "{{deployment}} share ready",
            ),
            query(
                'deployment:inference_server_ready:min{deployment=~"$deployment"}',
                "{{deployment}} all ready",
            ),
            desc="Recording rules in deploy/prometheus/rules.yml: a model served across "
            "hosts reads as one.",
            w=24,
        )
        .min(0)
        .max(1),
    ]


def _in_range(title: str, counter: str, by: str) -> bargauge.Panel:
    """How much a counter grew over the dashboard's time range, summed by ``by``."""
    expr = f"sum by ({by}) (increase({counter}{{{MANY}}}[$__range]){IN_DEPLOYMENT})"
    legend = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    return bars(title, "none", query(expr, legend, instant=True))


def _fleet_trouble() -> list[Panel]:
    alerts = table.Panel().title("Firing alerts").datasource(DATASOURCE).height(6).span(24)
    firing = 'ALERTS{alertstate="firing",alertname=~"Inference.*",instance=~"$instance"}'
    return [
        _in_range("Restarts in range", "inference_server_restarts_total", "instance, target"),
        _in_range(
            "Failed starts in range by reason", "inference_server_start_failures_total", "reason"
        ),
        _with_queries(alerts, [query(firing, instant=True).format(PromQueryFormat.TABLE)]),
    ]


DASHBOARDS: Final = {"inference-cold-start.json": cold_start, "inference-fleet.json": fleet}


def render(build: dash.Dashboard) -> str:
    """Dashboard JSON as committed: panel ids in layout order, two-space indent."""
    doc = json.loads(json.dumps(build.build(), cls=JSONEncoder))
    for number, panel in enumerate(doc["panels"], start=1):
        panel["id"] = number  # the SDK leaves ids unset (rows at 0); Grafana wants them unique
    return json.dumps(doc, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with --check, compare) every dashboard under grafana/."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = ROOT / "grafana" / name
        text = render(build())
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
    for name in stale:
        print(f"{name}: stale, run python tools/render_dashboards.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
