"""What the AMD child says beyond the NVML child's protocol, which it speaks otherwise unchanged.

Both children write ``nvml_protocol``'s ``Hello`` and ``Reply`` lines, so one parent loop
(``gpu.GpuSource``) supervises either. AMD GPUs add their RAS error totals to each GPU record.
Only the standard library here: the child imports this before ``amdsmi``.
"""

from __future__ import annotations

from typing import Final

from exporter.sources.nvml_protocol import GpuRecord

#: ``Hello.code`` when ``libamd_smi.so`` could not be loaded (AMDSMI_STATUS_FAIL_LOAD_MODULE).
LIBRARY_NOT_LOADED: Final = 4


class AmdGpuRecord(GpuRecord, total=False):
    """One AMD GPU: the shared fields plus its uncorrectable RAS total since the driver loaded.

    ``util`` is GFX activity, ``mem_util`` UMC activity; ``ecc_uncorrectable`` is absent where
    the GPU does not report RAS counts.
    """

    ecc_uncorrectable: int
