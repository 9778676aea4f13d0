"""SnapshotCollector: the latest Snapshot -> Prometheus metric families. No I/O.

A custom collector in the client_python style: fresh families every scrape, built from one
reference to an immutable snapshot. Nothing is registered on the global registry.
Sampling is timer-driven on purpose (lifecycle needs continuous history), so derived gauges
say in their HELP that they describe the last tick, and ``last_tick_timestamp_seconds``
lets an alert catch a stuck loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporter.base.model import FailureReason, GpuSample, LogClass, Phase, ProbeKind
from exporter.core.gpuhealth import throttle_active, xid_label_counts
from exporter.core.lifecycle import Histogram, observed_load_seconds
from exporter.core.snapshot import Snapshot, TargetSnapshot
from exporter.render.bounds import bound_families

_TICK_NOTE: Final = " (as of the last sampling tick)"


class SnapshotCollector(Collector):
    """Renders whatever snapshot ``latest()`` returns; before the first tick, only build info."""

    def __init__(self, latest: Callable[[], Snapshot | None], version: str) -> None:
        self._latest = latest
        self._version = version

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family of the latest snapshot."""
        snap = self._latest()
        yield _build_info(self._version)
        if snap is None:
            return
        yield from exporter_families(snap)
        yield from server_families(snap.targets)
        yield from bound_families(snap.targets)
        yield from gpu_families(snap)
        yield from mig_families(snap)
        yield from gpu_health_families(snap)
        yield from host_families(snap)


def mig_families(snap: Snapshot) -> Iterator[Metric]:
    """MIG mode per MIG-capable GPU, and one series set per MIG device and per target on one.

    Families without a series are left out, so a host with no MIG-capable GPU shows none.
    ``gpu_i_id`` and ``gpu_i_profile`` are dcgm-exporter's ``GPU_I_ID`` and ``GPU_I_PROFILE``,
    in this family's lower case; ``mig_uuid`` is what ``CUDA_VISIBLE_DEVICES`` names.
    """
    enabled = _gauge(
        "inference_gpu_mig_enabled",
        "1 if MIG mode is on (absent where the GPU cannot do MIG).",
        ("gpu", "uuid"),
    )
    for g in snap.gpus:
        if g.mig_enabled is not None and g.up:
            enabled.add_metric([str(g.index), g.uuid], 1.0 if g.mig_enabled else 0.0)
    labels = ("gpu", "uuid", "mig_uuid", "gpu_i_id")
    info = _gauge(
        "inference_gpu_mig_info",
        "A MIG device of a MIG-enabled GPU; value is 1.",
        (*labels, "compute_i_id", "gpu_i_profile"),
    )
    used = _gauge(
        "inference_gpu_mig_memory_used_bytes", "MIG device memory in use" + _TICK_NOTE, labels
    )
    total = _gauge("inference_gpu_mig_memory_total_bytes", "MIG device memory size.", labels)
    parents = {g.index: g.uuid for g in snap.gpus}
    for m in snap.migs:
        key = [str(m.gpu_index), parents.get(m.gpu_index, ""), m.uuid, str(m.gpu_instance_id)]
        info.add_metric([*key, str(m.compute_instance_id), m.profile or ""], 1.0)
        if m.memory_used_bytes is not None:
            used.add_metric(key, float(m.memory_used_bytes))
        if m.memory_total_bytes is not None:
            total.add_metric(key, float(m.memory_total_bytes))
    per_target = _gauge(
        "inference_server_mig_memory_used_bytes",
        "GPU memory held by the server's process tree, per MIG device it runs on" + _TICK_NOTE,
        ("target", "gpu", "mig_uuid"),
    )
    slice_of = {m.uuid: m.gpu_index for m in snap.migs}
    for t in snap.targets:
        for uuid, held in t.mig_memory_bytes:
            gpu = slice_of.get(uuid)
            per_target.add_metric([t.info.name, "" if gpu is None else str(gpu), uuid], held)
    yield from (f for f in (enabled, info, used, total, per_target) if f.samples)


def host_families(snap: Snapshot) -> Iterator[Metric]:
    """Host-wide evidence: disk reads and memory pressure, where their sources are up."""
    host = snap.host
    if host.disk is not None:
        disk = CounterMetricFamily(
            "inference_host_disk_read_bytes",
            "Bytes read from whole disks holding the models (partitions excluded); "
            "the evidence the lifecycle used" + _TICK_NOTE,
        )
        disk.add_metric([], float(host.disk.read_bytes))
        yield disk
    if host.memory_pressure is not None:
        psi = GaugeMetricFamily(
            "inference_host_memory_pressure_ratio",
            "Share of the last 10 s in which some (or, kind=full, all non-idle) tasks stalled "
            "on memory (Linux PSI); near 1 a host OOM kill is close" + _TICK_NOTE,
            labels=["kind"],
        )
        psi.add_metric(["some"], host.memory_pressure.some_ratio)
        psi.add_metric(["full"], host.memory_pressure.full_ratio)
        yield psi


def _build_info(version: str) -> Metric:
    info = GaugeMetricFamily(
        "inference_exporter_build_info", "Exporter version; value is 1.", labels=["version"]
    )
    info.add_metric([version], 1.0)
    return info


def exporter_families(snap: Snapshot) -> Iterator[Metric]:
    """The daemon's own health: last tick, tick cost, and each source's success."""
    tick = GaugeMetricFamily(
        "inference_exporter_last_tick_timestamp_seconds",
        "When the sampling loop last completed a tick; alert if time() minus this grows.",
    )
    tick.add_metric([], snap.taken_at)
    yield tick
    cost = GaugeMetricFamily(
        "inference_exporter_tick_duration_seconds", "Wall time the last sampling tick took."
    )
    cost.add_metric([], snap.tick_duration_seconds)
    yield cost
    overruns = CounterMetricFamily(
        "inference_exporter_tick_overruns",
        "Ticks that took longer than the interval since the exporter started.",
    )
    overruns.add_metric([], float(snap.tick_overruns))
    yield overruns
    if snap.discovery_dropped:  # no family on a host without discovery
        yield _per_source(
            GaugeMetricFamily(
                "inference_exporter_discovery_dropped_targets",
                "Targets discovery found but left out: past max_targets, or a name taken twice.",
                labels=["source"],
            ),
            snap.discovery_dropped,
        )
    up = GaugeMetricFamily(
        "inference_exporter_source_up",
        "1 if the source could observe in the last tick, 0 if it failed; left out while the "
        "source is absent.",
        labels=["source", "target"],
    )
    # Only absent sources get a series: the budget of STYLE.md is nearly spent, and a
    # present source already says so through source_up.
    absent = GaugeMetricFamily(
        "inference_exporter_source_absent",
        "1 while what the source reads is not on this host (no NVIDIA library, no PSI, no "
        "journal): no failure, so it has no source_up; present sources have no series.",
        labels=["source", "target"],
    )
    took = GaugeMetricFamily(
        "inference_exporter_source_duration_seconds",
        "Wall time of the source's call in the last tick.",
        labels=["source", "target"],
    )
    for s in snap.sources:
        key = [s.source, s.target or ""]
        if s.absent:
            absent.add_metric(key, 1.0)
        else:
            up.add_metric(key, 1.0 if s.up else 0.0)
        took.add_metric(key, s.duration_seconds)
    yield up
    yield absent
    yield took
    yield _per_source(
        CounterMetricFamily(
            "inference_exporter_source_errors",
            "Failed source calls since the exporter started.",
            labels=["source"],
        ),
        snap.source_errors,
    )


def _per_source(
    family: GaugeMetricFamily | CounterMetricFamily, counts: tuple[tuple[str, int], ...]
) -> GaugeMetricFamily | CounterMetricFamily:
    """``family`` with one sample per ``(source, count)``."""
    for source, count in counts:
        family.add_metric([source], float(count))
    return family


def _gauge(name: str, doc: str, labels: Iterable[str] = ("target",)) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def server_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    """Per-target families: info, phase, readiness, stall, progress, probes, process."""
    yield from _info_and_phase(targets)
    yield from _progress_families(targets)
    yield from _probe_families(targets)
    yield from _process_families(targets)
    yield from _log_families(targets)
    yield from _history_families(targets)
    yield from _counter_families(targets)


def _info_and_phase(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    info = _gauge(
        "inference_server_info",
        "Static facts about a watched server; value is 1. Join on target.",
        ("target", "engine", "deployment", "model", "namespace", "pod", "container"),
    )
    phase = _gauge(
        "inference_server_phase",
        "1 for the server's current lifecycle phase, 0 for the others" + _TICK_NOTE,
        ("target", "phase"),
    )
    since = _gauge(
        "inference_server_phase_start_timestamp_seconds", "When the current phase began."
    )
    ready = _gauge(
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
    stalled = _gauge(
        "inference_server_stalled",
        "1 if a starting, loading or initializing server shows no progress evidence for "
        "longer than its phase's threshold" + _TICK_NOTE,
    )
    last = _gauge(
        "inference_server_last_progress_timestamp_seconds",
        "When progress evidence (reads, GPU memory, logs, CPU, new processes) was last seen.",
    )
    quiet = _gauge(
        "inference_server_seconds_since_progress",
        "Seconds from the last progress evidence to the last tick; freezes if the loop "
        "stalls, so prefer time() - inference_server_last_progress_timestamp_seconds.",
    )
    ratio = _gauge(
        "inference_server_load_progress_ratio",
        "Weight-loading progress 0-1 from shard counts, bytes read or GPU memory; "
        "absent when unknown" + _TICK_NOTE,
    )
    eta = _gauge(
        "inference_server_eta_seconds",
        "Estimated seconds until ready from the load rate and history; absent when unknown"
        + _TICK_NOTE,
    )
    for t in targets:
        s, name = t.state, t.info.name
        stalled.add_metric([name], 1.0 if s.stalled else 0.0)
        _add_if(last, name, s.last_progress_at)
        _add_if(quiet, name, s.seconds_since_progress)
        _add_if(ratio, name, s.progress_ratio)
        _add_if(eta, name, s.eta_seconds)
    yield from (stalled, last, quiet, ratio, eta)


def _add_if(family: GaugeMetricFamily, target: str, value: float | None) -> None:
    if value is not None:
        family.add_metric([target], float(value))


def _probe_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    success = _gauge(
        "inference_server_probe_success",
        "1 if the last probe of this kind succeeded.",
        ("target", "probe"),
    )
    took = _gauge(
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
    backlog = _gauge(
        "inference_log_backlog_bytes",
        "Bytes of the engine's log file written and not read yet (a flood being drained)"
        + _TICK_NOTE,
    )
    lag = _gauge(
        "inference_log_lag_seconds",
        "How long the log source has been behind the log file; 0 when caught up" + _TICK_NOTE,
    )
    for t in targets:
        if t.log_backlog_bytes is not None:
            backlog.add_metric([t.info.name], float(t.log_backlog_bytes))
        if t.log_lag_seconds is not None:
            lag.add_metric([t.info.name], t.log_lag_seconds)
    yield backlog
    yield lag


def _process_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    start = _gauge(
        "inference_server_process_start_time_seconds",
        "Start time of the server's main process; cold starts are measured from it.",
    )
    rss = _gauge(
        "inference_server_process_resident_memory_bytes",
        "Resident memory of the server's process tree" + _TICK_NOTE,
    )
    count = _gauge("inference_server_processes", "Processes in the server's process tree.")
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
    gpu = _gauge(
        "inference_server_gpu_memory_used_bytes",
        "GPU memory held by the server's process tree, per GPU" + _TICK_NOTE,
        ("target", "gpu"),
    )
    orphaned = _gauge(
        "inference_server_orphaned_gpu_memory_bytes",
        "GPU memory still held by processes of the server's previous, dead instance (workers "
        "left behind), per GPU; absent when none" + _TICK_NOTE,
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


def _history_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    hist = HistogramMetricFamily(
        "inference_server_cold_start_duration_seconds",
        "Cold-start durations observed by this exporter, from process start to ready.",
        labels=["target"],
    )
    last = _gauge(
        "inference_server_last_cold_start_duration_seconds",
        "Duration of the last finished cold start (ready or failed).",
    )
    typical = _gauge(
        "inference_server_typical_cold_start_duration_seconds",
        "Median duration of this target's recent successful cold starts (history); absent "
        "until one finished.",
    )
    phases = _gauge(
        "inference_server_last_cold_start_phase_duration_seconds",
        "Time the last finished cold start spent in each startup phase.",
        ("target", "phase"),
    )
    wakes = HistogramMetricFamily(
        "inference_server_wake_duration_seconds",
        "Wakes from sleep mode observed by this exporter, from the weights coming back to "
        "awake; never counted as cold starts. Absent for a target until it woke once.",
        labels=["target"],
    )
    load = _gauge(
        "inference_server_load_duration_seconds",
        "Weight-load time of the last start as the engine timed it (source=engine) beside the "
        "observed loading phase (source=observed); only for engines that report it.",
        ("target", "source"),
    )
    for t in targets:
        reported = t.state.engine_report.load_seconds if t.state.engine_report else None
        if reported is not None:
            load.add_metric([t.info.name, "engine"], reported)
            observed = observed_load_seconds(t.state)
            if observed is not None:
                load.add_metric([t.info.name, "observed"], observed)
        counted = t.state.counters
        hist.add_metric(
            [t.info.name], _buckets(counted.cold_starts), counted.cold_starts.sum_seconds
        )
        if counted.wakes.count:  # most servers never sleep: no 13 empty series each
            wakes.add_metric([t.info.name], _buckets(counted.wakes), counted.wakes.sum_seconds)
        _add_if(typical, t.info.name, t.typical_start_seconds)
        cold = t.state.last_cold_start
        if cold is not None:
            last.add_metric([t.info.name], cold.duration_seconds)
            for phase, seconds in cold.phase_seconds:
                phases.add_metric([t.info.name, phase.value], seconds)
    yield from (hist, wakes, last, typical, phases, load)


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, n in zip((*hist.bounds, float("inf")), hist.bucket_counts, strict=True):
        running += n
        out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
    return out


def _counter_families(targets: tuple[TargetSnapshot, ...]) -> Iterator[Metric]:
    restarts = CounterMetricFamily(
        "inference_server_restarts",
        "New server processes seen after the first (restarts).",
        labels=["target"],
    )
    failures = CounterMetricFamily(
        "inference_server_start_failures",
        "Cold starts that ended without becoming ready, by reason.",
        labels=["target", "reason"],
    )
    deaths = CounterMetricFamily(  # reasons seen only: all from the start would break the budget
        "inference_server_deaths",
        "Server processes that ended after ready, by the fatal line's reason, else exited.",
        labels=["target", "reason"],
    )
    lines = CounterMetricFamily(
        "inference_server_log_lines",
        "Engine log lines read, by class (benign = known startup noise).",
        labels=["target", "class"],
    )
    for t in targets:
        c, name = t.state.counters, t.info.name
        restarts.add_metric([name], float(c.restarts))
        fails = dict(c.start_failures)
        for reason in FailureReason:
            failures.add_metric([name, reason.value], float(fails.get(reason, 0)))
        for reason, n in c.deaths:
            deaths.add_metric([name, reason.value], float(n))
        counts = dict(c.log_lines)
        for cls in LogClass:
            lines.add_metric([name, cls.value], float(counts.get(cls, 0)))
    yield from (restarts, failures, deaths, lines)


def gpu_families(snap: Snapshot) -> Iterator[Metric]:
    """Per-GPU families; a field the GPU does not support is absent, never 0."""
    labels = ("gpu", "uuid")
    fams = {
        "up": _gauge("inference_gpu_up", "1 if the GPU answered NVML in the last sample.", labels),
        "info": _gauge(
            "inference_gpu_info",
            "GPU model name and vendor (nvidia, amd); value is 1.",
            (*labels, "name", "vendor"),
        ),
        "memory_used_bytes": _gauge(
            "inference_gpu_memory_used_bytes", "GPU memory in use" + _TICK_NOTE, labels
        ),
        "memory_total_bytes": _gauge(
            "inference_gpu_memory_total_bytes", "GPU memory installed.", labels
        ),
        "memory_reserved_bytes": _gauge(
            "inference_gpu_memory_reserved_bytes", "GPU memory reserved by the driver.", labels
        ),
        "utilization_ratio": _gauge(
            "inference_gpu_utilization_ratio",
            "Share of time a kernel ran; never progress evidence on its own" + _TICK_NOTE,
            labels,
        ),
        "memory_utilization_ratio": _gauge(
            "inference_gpu_memory_utilization_ratio",
            "Share of time GPU memory was read or written" + _TICK_NOTE,
            labels,
        ),
        "pcie_rx_bytes_per_second": _gauge(
            "inference_gpu_pcie_rx_bytes_per_second",
            "PCIe receive throughput (host to GPU: weights flowing in)" + _TICK_NOTE,
            labels,
        ),
    }
    for g in snap.gpus:
        key = [str(g.index), g.uuid]
        fams["up"].add_metric(key, 1.0 if g.up else 0.0)
        fams["info"].add_metric([*key, g.name, g.vendor], 1.0)
        for attr in (
            "memory_used_bytes",
            "memory_total_bytes",
            "memory_reserved_bytes",
            "utilization_ratio",
            "memory_utilization_ratio",
            "pcie_rx_bytes_per_second",
        ):
            value = getattr(g, attr)
            if value is not None and g.up:
                fams[attr].add_metric(key, float(value))
    yield from fams.values()
    foreign = _gauge(
        "inference_gpu_foreign_memory_used_bytes",
        "GPU memory held by processes of no watched server (e.g. an engine auto-started at boot).",
        ("gpu",),
    )
    for index, used in snap.foreign_gpu_memory_bytes:
        foreign.add_metric([str(index)], float(used))
    yield foreign
    unattributed = _gauge(
        "inference_gpu_unattributed_processes",
        "GPU processes whose pid is not visible in the exporter's PID namespace.",
        (),
    )
    unattributed.add_metric([], float(snap.unattributed_gpu_processes))
    yield unattributed


# --- GPU health -----------------------------------------------------------------------------

#: One-value health gauges: the ``GpuSample`` field, the metric name and its help.
_HEALTH_GAUGES: Final = (
    (
        "retired_pages_pending",
        "inference_gpu_retired_pages_pending",
        "1 if ECC-faulty pages wait to be retired at the next GPU reset.",
    ),
    (
        "remapped_rows_pending",
        "inference_gpu_remapped_rows_pending",
        "1 if a row remap waits for the next GPU reset (the GPU should be reset).",
    ),
    (
        "remapped_rows_failed",
        "inference_gpu_remapped_rows_failed",
        "1 if a row remap failed (no spare rows left: the GPU needs replacing).",
    ),
    (
        "pcie_link_generation",
        "inference_gpu_pcie_link_generation",
        "PCIe link generation now (it may train down at idle to save power).",
    ),
    (
        "pcie_link_generation_max",
        "inference_gpu_pcie_link_generation_max",
        "Highest PCIe link generation of the GPU and its slot.",
    ),
    ("pcie_link_width", "inference_gpu_pcie_link_width", "PCIe link width now, in lanes."),
    (
        "pcie_link_width_max",
        "inference_gpu_pcie_link_width_max",
        "Widest PCIe link of the GPU and its slot, in lanes.",
    ),
)
_HEALTH_GAUGE_FIELDS: Final = tuple(field for field, _, _ in _HEALTH_GAUGES)
#: The 0/1 repair flags: shown while 1 (the PCIe link gauges while the link is narrowed).
_HEALTH_FLAG_FIELDS: Final = (
    "retired_pages_pending",
    "remapped_rows_pending",
    "remapped_rows_failed",
)


def gpu_health_families(snap: Snapshot) -> Iterator[Metric]:
    """Per-GPU health: Xid and ECC counters, row remaps, throttle reasons, PCIe link.

    By default a series is there while it shows a problem (an Xid counted, uncorrectable ECC
    errors, a pending or failed repair, an active throttle reason, a link narrower than its
    max), so a healthy host adds none and keeps STYLE.md's series budget; alert rules compare
    against a problem, so a missing series is a healthy GPU. ``all_gpu_health`` exports every
    reading (13 series a GPU), and names the readings the GPU or driver cannot give.
    """
    labels = ["gpu", "uuid"]
    xids = CounterMetricFamily(
        "inference_gpu_xid_errors",
        "Critical Xid error events since the exporter started, by Xid code "
        "(well-known codes, else other).",
        labels=[*labels, "xid"],
    )
    ecc = CounterMetricFamily(
        "inference_gpu_ecc_uncorrected_volatile_errors",
        "Uncorrectable ECC errors since the driver loaded "
        "(NVML volatile count, amd-smi RAS total).",
        labels=labels,
    )
    gauges = {field: _gauge(name, doc, labels) for field, name, doc in _HEALTH_GAUGES}
    throttle = _gauge(
        "inference_gpu_clock_throttle_active",
        "1 if clocks are held down for this reason now.",
        (*labels, "reason"),
    )
    unsupported = _gauge(
        "inference_gpu_health_unsupported",
        "1 for a health reading this GPU or driver cannot give (its metric is absent).",
        (*labels, "reading"),
    )
    every = snap.all_gpu_health
    for g in snap.gpus:
        key = [str(g.index), g.uuid]
        for label, count in xid_label_counts(g.xid_counts):
            xids.add_metric([*key, label], float(count))
        for reading in g.unsupported if every else ():
            unsupported.add_metric([*key, reading], 1.0)
        if not g.up:
            continue
        if g.ecc_uncorrected_volatile is not None and (every or g.ecc_uncorrected_volatile):
            ecc.add_metric(key, float(g.ecc_uncorrected_volatile))
        shown = _HEALTH_GAUGE_FIELDS if every or _link_narrowed(g) else _HEALTH_FLAG_FIELDS
        for field in shown:
            value = getattr(g, field)
            if value is not None and (every or value):
                gauges[field].add_metric(key, float(value))
        if g.throttle_reasons is not None:
            for reason, active in throttle_active(g.throttle_reasons).items():
                if every or active:
                    throttle.add_metric([*key, reason], 1.0 if active else 0.0)
    yield from (xids, ecc, *gauges.values(), throttle, unsupported)


def _link_narrowed(g: GpuSample) -> bool:
    """The PCIe link runs on fewer lanes than GPU and slot allow (a bad slot or riser).

    Width only: the generation trains down at idle to save power, which is no problem.
    """
    width, widest = g.pcie_link_width, g.pcie_link_width_max
    return width is not None and widest is not None and width < widest
