"""Which GPU vendors' children run, and how their readings become one GPU list.

Auto-detect: the NVML child runs unless ``nvml = false``; the AMD child runs when a
``libamd_smi.so`` is where the ``amdsmi`` binding looks (``amdsmi = false`` turns it off).
When both run, a vendor whose library turns out absent is "not present", not down: an AMD
host does not alert on its missing NVML. With no ``libamd_smi.so`` only NVML runs, and
without its library it reads as absent (``SourceAbsent``), with the keys that turn it off.

GPU indices when both vendors are present: NVIDIA's first, as NVML numbers them, then AMD's
after the last NVIDIA one (AMD index i is exported as ``gpu = nvidia_count + i``). On a host
with one vendor, which is nearly every host, indices are that vendor's own (nvidia-smi's or
amd-smi's), so the ``gpu`` label and a target's ``gpus`` mean what the vendor's tools say.
NVIDIA first because its count comes from the same host's NVML and the NVML indices are the
ones existing dashboards and configs already use; UUIDs stay unique either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from exporter.base.errors import SourceError
from exporter.base.model import GpuReading
from exporter.config import Settings
from exporter.sources.gpu.amd.source import AmdGpuSource, amdsmi_library_present
from exporter.sources.gpu.source import ABSENT_REASONS, GpuSource

log = logging.getLogger(__name__)


class OptionalVendor:
    """A vendor's source that reads as no GPUs, not as an error, while its library is absent.

    The vendor's source keeps retrying with its backoff, so a library installed later is
    picked up.
    """

    def __init__(self, source: GpuSource) -> None:
        self.source = source
        self._said_absent = False

    @property
    def name(self) -> str:
        """The vendor source's name (``nvml``, ``amdsmi``)."""
        return self.source.name

    def sample(self, deadline: float | None = None) -> GpuReading:
        """The vendor's reading; an empty one while its library is absent.

        Raises:
            SourceError: the vendor's library is there and failing.
        """
        try:
            return self.source.sample(deadline)
        except SourceError as exc:
            if exc.reason not in ABSENT_REASONS:
                raise
            if not self._said_absent:
                self._said_absent = True
                log.info("%s not present reason=%s", self.name, exc.reason)
            return GpuReading(gpus=())

    def close(self) -> None:
        """Stop the vendor's child."""
        self.source.close()


def vendor_sources(
    settings: Settings, child_env: Mapping[str, str] | None
) -> list[GpuSource | OptionalVendor]:
    """The GPU sources this host gets, NVIDIA's first (the order of the GPU indices)."""
    nvidia = (
        GpuSource(library_dir=settings.nvml_library_dir, child_env=child_env)
        if settings.nvml
        else None
    )
    if not (settings.amdsmi and amdsmi_library_present(settings.amdsmi_library_dir)):
        return [nvidia] if nvidia is not None else []
    amd = AmdGpuSource(library_dir=settings.amdsmi_library_dir, child_env=child_env)
    return [OptionalVendor(s) for s in (nvidia, amd) if s is not None]


def merge_readings(readings: Sequence[GpuReading]) -> GpuReading:
    """One reading from each vendor's, in ``vendor_sources`` order, indices made disjoint.

    Each vendor's indices (of GPUs, processes and MIG devices' parents) move up by the GPU
    count of the vendors before it; stale if any is.
    """
    if len(readings) == 1:
        return readings[0]
    gpus, processes, migs, offset = [], [], [], 0
    for reading in readings:
        gpus += [replace(g, index=g.index + offset) for g in reading.gpus]
        processes += [replace(p, gpu_index=p.gpu_index + offset) for p in reading.processes]
        migs += [replace(m, gpu_index=m.gpu_index + offset) for m in reading.migs]
        offset += len(reading.gpus)
    return GpuReading(
        tuple(gpus),
        tuple(processes),
        stale=any(reading.stale for reading in readings),
        migs=tuple(migs),
    )
