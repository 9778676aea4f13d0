"""Per-GPU families: memory and use, MIG devices, and health (Xid, ECC, throttles, PCIe)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.base.model import GpuSample
from exporter.core.gpuhealth import throttle_active, xid_label_counts
from exporter.core.snapshot import Snapshot
from exporter.render.metrics.common import TICK_NOTE, gauge


def gpu_families(snap: Snapshot) -> Iterator[Metric]:
    """Per-GPU families; a field the GPU does not support is absent, never 0."""
    labels = ("gpu", "uuid")
    fams = {
        "up": gauge("inference_gpu_up", "1 if the GPU answered NVML in the last sample.", labels),
        "info": gauge(
            "inference_gpu_info",
            "GPU model name and vendor (nvidia, amd); value is 1.",
            (*labels, "name", "vendor"),
        ),
        "memory_used_bytes": gauge(
            "inference_gpu_memory_used_bytes", "GPU memory in use" + TICK_NOTE, labels
        ),
        "memory_total_bytes": gauge(
            "inference_gpu_memory_total_bytes", "GPU memory installed.", labels
        ),
        "memory_reserved_bytes": gauge(
            "inference_gpu_memory_reserved_bytes", "GPU memory reserved by the driver.", labels
        ),
        "utilization_ratio": gauge(
            "inference_gpu_utilization_ratio",
            "Share of time a kernel ran; never progress evidence on its own" + TICK_NOTE,
            labels,
        ),
        "memory_utilization_ratio": gauge(
            "inference_gpu_memory_utilization_ratio",
            "Share of time GPU memory was read or written" + TICK_NOTE,
            labels,
        ),
        "pcie_rx_bytes_per_second": gauge(
            "inference_gpu_pcie_rx_bytes_per_second",
            "PCIe receive throughput (host to GPU: weights flowing in)" + TICK_NOTE,
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
    foreign = gauge(
        "inference_gpu_foreign_memory_used_bytes",
        "GPU memory held by processes of no watched server (e.g. an engine auto-started at boot).",
        ("gpu",),
    )
    for index, used in snap.foreign_gpu_memory_bytes:
        foreign.add_metric([str(index)], float(used))
    yield foreign
    unattributed = gauge(
        "inference_gpu_unattributed_processes",
        "GPU processes whose pid is not visible in the exporter's PID namespace.",
        (),
    )
    unattributed.add_metric([], float(snap.unattributed_gpu_processes))
    yield unattributed


def mig_families(snap: Snapshot) -> Iterator[Metric]:
    """MIG mode per MIG-capable GPU, and one series set per MIG device and per target on one.

    Families without a series are left out, so a host with no MIG-capable GPU shows none.
    ``gpu_i_id`` and ``gpu_i_profile`` are dcgm-exporter's ``GPU_I_ID`` and ``GPU_I_PROFILE``,
    in this family's lower case; ``mig_uuid`` is what ``CUDA_VISIBLE_DEVICES`` names.
    """
    enabled = gauge(
        "inference_gpu_mig_enabled",
        "1 if MIG mode is on (absent where the GPU cannot do MIG).",
        ("gpu", "uuid"),
    )
    for g in snap.gpus:
        if g.mig_enabled is not None and g.up:
            enabled.add_metric([str(g.index), g.uuid], 1.0 if g.mig_enabled else 0.0)
    labels = ("gpu", "uuid", "mig_uuid", "gpu_i_id")
    info = gauge(
        "inference_gpu_mig_info",
        "A MIG device of a MIG-enabled GPU; value is 1.",
        (*labels, "compute_i_id", "gpu_i_profile"),
    )
    used = gauge(
        "inference_gpu_mig_memory_used_bytes", "MIG device memory in use" + TICK_NOTE, labels
    )
    total = gauge("inference_gpu_mig_memory_total_bytes", "MIG device memory size.", labels)
    parents = {g.index: g.uuid for g in snap.gpus}
    for m in snap.migs:
        key = [str(m.gpu_index), parents.get(m.gpu_index, ""), m.uuid, str(m.gpu_instance_id)]
        info.add_metric([*key, str(m.compute_instance_id), m.profile or ""], 1.0)
        if m.memory_used_bytes is not None:
            used.add_metric(key, float(m.memory_used_bytes))
        if m.memory_total_bytes is not None:
            total.add_metric(key, float(m.memory_total_bytes))
    per_target = gauge(
        "inference_server_mig_memory_used_bytes",
        "GPU memory held by the server's process tree, per MIG device it runs on" + TICK_NOTE,
        ("target", "gpu", "mig_uuid"),
    )
    slice_of = {m.uuid: m.gpu_index for m in snap.migs}
    for t in snap.targets:
        for uuid, held in t.mig_memory_bytes:
            gpu = slice_of.get(uuid)
            per_target.add_metric([t.info.name, "" if gpu is None else str(gpu), uuid], held)
    yield from (f for f in (enabled, info, used, total, per_target) if f.samples)


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
    gauges = {field: gauge(name, doc, labels) for field, name, doc in _HEALTH_GAUGES}
    throttle = gauge(
        "inference_gpu_clock_throttle_active",
        "1 if clocks are held down for this reason now.",
        (*labels, "reason"),
    )
    unsupported = gauge(
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
