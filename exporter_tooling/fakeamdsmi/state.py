"""The fake amd-smi's state file: the fake NVML's format plus the lines only AMD has.

``gpu`` and ``proc`` lines (``exporter_tooling.fakenvml.gpu_line``/``proc_line``) and
``write_state`` are shared, so the simulator's one state file drives either vendor.
"""

from __future__ import annotations

from typing import Final

#: Env variable naming the state file the simulated libamd_smi.so reads on every call.
STATE_ENV: Final = "SIMULATED_AMDSMI_STATE"


def ecc_line(index: int, correctable: int, uncorrectable: int, deferred: int = 0) -> str:
    """One ``ecc`` line: GPU ``index``'s RAS error totals (no line: ECC not supported)."""
    return f"ecc {index} {correctable} {uncorrectable} {deferred}"
