"""The NVML child's records as samples: converted, impossible values dropped, health tracked.

Pure: no I/O. A driver, a binding whose struct layout does not match it, or a GPU falling off
the bus can hand back values no GPU has (1.8e19 bytes used of 80 GiB, a utilisation of
4.3e9 %); each such field reads as unknown (None), as an unsupported one does, and
``ValueCheck`` counts it and says once which field of which GPU it dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final, TypeVar

from exporter.base.model import GpuSample, MigSample
from exporter.sources.gpu.protocol import GpuRecord, MigRecord

# The GPU source's logger: what it says of its readings reads as it did before the move.
log = logging.getLogger("exporter.sources.gpu.source")

_KIB: Final = 1024  # NVML reports PCIe throughput in KB/s, meaning KiB/s as nvitop reads it
#: Distinct Xid codes counted per GPU; further new codes count under ``XID_OVERFLOW``.
MAX_XID_CODES: Final = 256
XID_OVERFLOW: Final = -1


def optional_int(value: int | None) -> int | None:
    """An integer field of a record, None where the GPU or driver lacks it."""
    return None if value is None else int(value)


def _ratio(percent: int | None) -> float | None:
    return None if percent is None else int(percent) / 100.0


def gpu_sample(raw: GpuRecord) -> GpuSample:
    """Convert one GPU of a child's reply; unsupported fields stay None."""
    rx_kb = raw.get("pcie_rx_kb")
    error = raw.get("error")
    return GpuSample(
        index=int(raw["index"]),
        uuid=str(raw["uuid"]),
        name=str(raw["name"]),
        up=bool(raw["up"]),
        memory_used_bytes=optional_int(raw.get("used")),
        memory_total_bytes=optional_int(raw.get("total")),
        memory_reserved_bytes=optional_int(raw.get("reserved")),
        utilization_ratio=_ratio(raw.get("util")),
        memory_utilization_ratio=_ratio(raw.get("mem_util")),
        pcie_rx_bytes_per_second=None if rx_kb is None else float(int(rx_kb) * _KIB),
        error=None if error is None else str(error),
    )


def with_mig_mode(sample: GpuSample, raw: GpuRecord) -> GpuSample:
    """The GPU's MIG mode now and after a reset, where the GPU can do MIG at all."""
    if "mig_mode" not in raw:
        return sample
    current = bool(raw["mig_mode"])
    return replace(sample, mig_enabled=current, mig_pending=bool(raw.get("mig_pending", current)))


def mig_sample(raw: MigRecord) -> MigSample:
    """Convert one MIG device of a child's reply."""
    profile = raw.get("profile")
    return MigSample(
        gpu_index=int(raw["gpu"]),
        uuid=str(raw["uuid"]),
        gpu_instance_id=int(raw["gi"]),
        compute_instance_id=int(raw["ci"]),
        profile=None if profile is None else str(profile),
        memory_used_bytes=optional_int(raw.get("used")),
        memory_total_bytes=optional_int(raw.get("total")),
    )


def with_health(gpu: GpuSample, raw: GpuRecord) -> GpuSample:
    """``gpu`` with the health fields of its record; a field the record lacks stays None."""
    remap = raw.get("remap")
    _, uncorrectable, pending, failure = (int(v) for v in remap) if remap else (None,) * 4
    link = raw.get("pcie_link")
    gen, gen_max, width, width_max = (int(v) for v in link) if link else (None,) * 4
    ecc, retired, throttle = (
        raw.get("ecc_uncorrected"),
        raw.get("retired_pending"),
        raw.get("throttle"),
    )
    return replace(
        gpu,
        xids=tuple(int(code) for code in raw.get("xids", ())),
        unsupported=tuple(str(name) for name in raw.get("unsupported", ())),
        ecc_uncorrected_volatile=optional_int(ecc),
        retired_pages_pending=None if retired is None else bool(retired),
        remapped_rows_uncorrectable=uncorrectable,
        remapped_rows_pending=None if pending is None else bool(pending),
        remapped_rows_failed=None if failure is None else bool(failure),
        throttle_reasons=optional_int(throttle),
        pcie_link_generation=gen,
        pcie_link_generation_max=gen_max,
        pcie_link_width=width,
        pcie_link_width_max=width_max,
    )


class HealthTracker:
    """What GPU health needs across samples: Xid totals and the last ECC count, per UUID.

    Kept in the parent, so a restarted NVML child neither resets the Xid counters nor
    makes the ECC count it reads again look like new errors.
    """

    def __init__(self, warn_once: Callable[..., None]) -> None:
        self._xids: dict[str, dict[int, int]] = {}
        self._ecc: dict[str, int] = {}
        self._warn_once = warn_once

    def apply(self, gpu: GpuSample) -> GpuSample:
        """The sample with its Xid totals and ECC growth filled in."""
        counts = self._xids.setdefault(gpu.uuid, {})
        for code in gpu.xids:
            # Raw codes: which are well known (their own label) is the core's to say. A
            # driver inventing codes cannot grow the table past its bound.
            kept = code if code in counts or len(counts) < MAX_XID_CODES else XID_OVERFLOW
            counts[kept] = counts.get(kept, 0) + 1
            log.warning("gpu xid gpu=%d uuid=%s xid=%d", gpu.index, gpu.uuid, code)
        new_ecc = 0
        if gpu.ecc_uncorrected_volatile is not None:
            before = self._ecc.get(gpu.uuid)
            if before is not None and gpu.ecc_uncorrected_volatile > before:
                new_ecc = gpu.ecc_uncorrected_volatile - before
            self._ecc[gpu.uuid] = gpu.ecc_uncorrected_volatile
        for reading in gpu.unsupported:
            self._warn_once(
                f"unsupported:{gpu.uuid}:{reading}",
                "nvml health reading unsupported gpu=%d uuid=%s reading=%s hint=%s",
                gpu.index,
                gpu.uuid,
                reading,
                "this GPU or driver lacks the call (older driver or GPU model); its metric is "
                "left out, everything else is read",
            )
        return replace(gpu, xid_counts=tuple(sorted(counts.items())), ecc_uncorrected_new=new_ecc)


#: Above any GPU's memory for years to come (the largest today hold under 300 GiB); beyond
#: it a total is a garbage read, not a GPU.
MAX_MEMORY_BYTES: Final = 1 << 44
#: PCIe 7.0 x16 moves about 256 GB/s a direction: four times that is a garbage read.
MAX_PCIE_BYTES_PER_SECOND: Final = 1 << 40


_Sample = TypeVar("_Sample", GpuSample, MigSample)


def _over(value: float | None, limit: float) -> bool:
    return value is not None and not 0 <= value <= limit


def _memory_limits(total: int | None) -> dict[str, float]:
    """Used and reserved memory fit in the total, once the total itself is plausible."""
    within = MAX_MEMORY_BYTES if total is None or _over(total, MAX_MEMORY_BYTES) else total
    return {
        "memory_total_bytes": MAX_MEMORY_BYTES,
        "memory_used_bytes": within,
        "memory_reserved_bytes": within,
    }


def _checked(sample: _Sample, limits: dict[str, float]) -> tuple[_Sample, tuple[str, ...]]:
    dropped = tuple(
        name for name, limit in limits.items() if _over(getattr(sample, name, None), limit)
    )
    unknown: dict[str, Any] = dict.fromkeys(dropped)
    return (replace(sample, **unknown) if dropped else sample), dropped


def _checked_gpu(gpu: GpuSample) -> tuple[GpuSample, tuple[str, ...]]:
    """``gpu`` with every impossible field set to None, and the names of those fields.

    Memory is checked against the total, ratios against 0-1, the PCIe rate against what a
    link can carry.
    """
    return _checked(
        gpu,
        {
            **_memory_limits(gpu.memory_total_bytes),
            "utilization_ratio": 1.0,
            "memory_utilization_ratio": 1.0,
            "pcie_rx_bytes_per_second": MAX_PCIE_BYTES_PER_SECOND,
        },
    )


def _checked_mig(mig: MigSample) -> tuple[MigSample, tuple[str, ...]]:
    """``mig`` with impossible memory readings set to None, and the names of those fields."""
    limits = _memory_limits(mig.memory_total_bytes)
    del limits["memory_reserved_bytes"]  # a slice reports no reserved memory
    return _checked(mig, limits)


class ValueCheck:
    """Turns records into samples with impossible fields unknown; counts and logs them once."""

    def __init__(self, source: str, warn_once: Callable[..., None]) -> None:
        self.rejected = 0
        self._source = source
        self._warn_once = warn_once

    def gpu(self, raw: GpuRecord) -> GpuSample:
        """One GPU of a reply, checked."""
        gpu, dropped = _checked_gpu(gpu_sample(raw))
        self._note(gpu.uuid, dropped)
        return gpu

    def mig(self, raw: MigRecord) -> MigSample:
        """One MIG device of a reply, checked."""
        mig, dropped = _checked_mig(mig_sample(raw))
        self._note(mig.uuid, dropped)
        return mig

    def _note(self, uuid: str, dropped: tuple[str, ...]) -> None:
        self.rejected += len(dropped)
        for field in dropped:
            self._warn_once(
                f"implausible:{uuid}:{field}",
                "%s reading out of range, exported as unknown uuid=%s field=%s hint=%s",
                self._source,
                uuid,
                field,
                "the driver or binding returned a value no GPU has (memory above the total, "
                "a ratio above 1); align the binding with the driver, or check the GPU",
            )
