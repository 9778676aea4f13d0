"""What the AMD child says beyond the NVML child's protocol, which it speaks otherwise unchanged.

Both children write ``gpu.protocol``'s ``Hello`` and ``Reply`` lines, so one parent loop
(``gpu.source.GpuSource``) supervises either; an AMD GPU's RAS total travels as ``ecc_uncorrected``.
Only the standard library here: the child imports this before ``amdsmi``.
"""

from __future__ import annotations

from typing import Final

#: ``Hello.code`` when ``libamd_smi.so`` could not be loaded (AMDSMI_STATUS_FAIL_LOAD_MODULE).
LIBRARY_NOT_LOADED: Final = 4
