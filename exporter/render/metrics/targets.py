"""Per-target families: info, phase, readiness, progress, probes, process and logs."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.base.model import Phase, ProbeKind
from exporter.core.snapshot import TargetSnapshot
from exporter.render.metrics.common import TICK_NOTE, add_if, gauge
from exporter.render.metrics.counters import counter_families, history_families


def server_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    """Per-target families: info, phase, readiness, stall, progress, probes, process."""
    yield from _info_and_phase(targets)
    yield from _progress_families(targets)
    yield from _probe_families(targets)
    yield from _process_families(targets)
    yield from _log_families(targets)
    yield from history_families(targets)
    yield from counter_families(targets)


def _info_and_phase(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    info = gauge(
        "inference_server_info",
        "Static facts about a watched server; value is 1. Join on target.",
        ("target", "engine", "deployment", "model", "namespace", "pod", "container"),
    )
    phase = gauge(
        "inference_server_phase",
        "1 for the server's current lifecycle phase, 0 for the others" + TICK_NOTE,
        ("target", "phase"),
    )
    since = gauge("inference_server_phase_start_timestamp_seconds", "When the current phase began.")
    ready = gauge(
        "inference_server_ready", "1 if the readiness probe answers OK (ready or serving)."
    )
    for t in targets:
        s = t.state
        i = t.info
        info.add_metric(
            [i.name, i.engine, i.deployment, i.model, i.namespace, i.pod, i.container], 1.0
        )
        for p in Phase:
            phase.add_metric([t.info.name, p.value], 1.0 if s.phase is p else 0.0)
        if s.phase_since is not None:
            since.add_metric([t.info.name], s.phase_since)
        ready.add_metric([t.info.name], 1.0 if s.ready else 0.0)
    yield from (info, phase, since, ready)


def _progress_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    stalled = gauge(
        "inference_server_stalled",
        "1 if a starting, loading or initializing server shows no progress evidence for "
        "longer than its phase's threshold" + TICK_NOTE,
    )
    last = gauge(
        "inference_server_last_progress_timestamp_seconds",
        "When progress evidence (reads, GPU memory, logs, CPU, new processes) was last seen.",
    )
    quiet = gauge(
        "inference_server_seconds_since_progress",
        "Seconds from the last progress evidence to the last tick; freezes if the loop "
        "stalls, so prefer time() - inference_server_last_progress_timestamp_seconds.",
    )
    ratio = gauge(
        "inference_server_load_progress_ratio",
        "Weight-loading progress 0-1 from shard counts, bytes read or GPU memory; "
        "absent when unknown" + TICK_NOTE,
    )
    eta = gauge(
        "inference_server_eta_seconds",
        "Estimated seconds until ready from the load rate and history; absent when unknown"
        + TICK_NOTE,
    )
    for t in targets:
        s, name = t.state, t.info.name
        stalled.add_metric([name], 1.0 if s.stalled else 0.0)
        add_if(last, name, s.last_progress_at)
        add_if(quiet, name, s.seconds_since_progress)
        add_if(ratio, name, s.progress_ratio)
        add_if(eta, name, s.eta_seconds)
    yield from (stalled, last, quiet, ratio, eta)


def _probe_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    success = gauge(
        "inference_server_probe_success",
        "1 if the last probe of this kind succeeded.",
        ("target", "probe"),
    )
    took = gauge(
        "inference_server_probe_duration_seconds",
        "Wall time of the last probe of this kind.",
        ("target", "probe"),
    )
    for t in targets:
        for kind, result in (
            (ProbeKind.HEALTH, t.state.last_health),
            (ProbeKind.COMPLETION, t.state.last_completion),
        ):
            if result is not None:
                success.add_metric([t.info.name, kind.value], 1.0 if result.ok else 0.0)
                took.add_metric([t.info.name, kind.value], result.duration_seconds)
    yield from (success, took)


def _log_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    backlog = gauge(
        "inference_log_backlog_bytes",
        "Bytes of the engine's log file written and not read yet (a flood being drained)"
        + TICK_NOTE,
    )
    lag = gauge(
        "inference_log_lag_seconds",
        "How long the log source has been behind the log file; 0 when caught up" + TICK_NOTE,
    )
    for t in targets:
        if t.log_backlog_bytes is not None:
            backlog.add_metric([t.info.name], float(t.log_backlog_bytes))
        if t.log_lag_seconds is not None:
            lag.add_metric([t.info.name], t.log_lag_seconds)
    yield backlog
    yield lag


def _process_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    start = gauge(
        "inference_server_process_start_time_seconds",
        "Start time of the server's main process; cold starts are measured from it.",
    )
    rss = gauge(
        "inference_server_process_resident_memory_bytes",
        "Resident memory of the server's process tree" + TICK_NOTE,
    )
    count = gauge("inference_server_processes", "Processes in the server's process tree.")
    reads = CounterMetricFamily(
        "inference_server_process_read_bytes",
        "Block-layer bytes read by the process tree (/proc/PID/io read_bytes; sees mmap).",
        labels=["target"],
    )
    cpu = CounterMetricFamily(
        "inference_server_process_cpu_seconds",
        "User and system CPU time of the process tree.",
        labels=["target"],
    )
    gpu = gauge(
        "inference_server_gpu_memory_used_bytes",
        "GPU memory held by the server's process tree, per GPU" + TICK_NOTE,
        ("target", "gpu"),
    )
    orphaned = gauge(
        "inference_server_orphaned_gpu_memory_bytes",
        "GPU memory still held by processes of the server's previous, dead instance (workers "
        "left behind), per GPU; absent when none" + TICK_NOTE,
        ("target", "gpu"),
    )
    for t in targets:
        p, name = t.process, t.info.name
        if p is not None:
            start.add_metric([name], p.create_time)
            rss.add_metric([name], float(p.rss_bytes))
            count.add_metric([name], float(p.process_count))
            cpu.add_metric([name], p.cpu_seconds)
            if p.read_bytes is not None:
                reads.add_metric([name], float(p.read_bytes))
        for index, used in t.gpu_memory_bytes:
            gpu.add_metric([name, str(index)], float(used))
        for index, used in t.orphaned_gpu_memory_bytes:
            orphaned.add_metric([name, str(index)], float(used))
    yield from (start, rss, count, reads, cpu, gpu, orphaned)
