"""A fake ``libnvidia-ml.so.1`` for hosts without a GPU: its C source, its builder, its state file.

The library answers NVML calls from a text file named by ``SIMULATED_NVML_STATE``; the tests,
the demo and the bench build it with the system C compiler and write that file.
"""

from exporter_tooling.fakenvml.build import (
    LIBRARY_NAME,
    VARIANTS,
    SimulatedNvmlBuildError,
    build_simulated_nvml,
)
from exporter_tooling.fakenvml.state import (
    STATE_ENV,
    gpu_line,
    health_lines,
    mig_line,
    mig_mode_line,
    mig_proc_line,
    proc_line,
    write_state,
    xid_line,
)

__all__ = [
    "LIBRARY_NAME",
    "STATE_ENV",
    "VARIANTS",
    "SimulatedNvmlBuildError",
    "build_simulated_nvml",
    "gpu_line",
    "health_lines",
    "mig_line",
    "mig_mode_line",
    "mig_proc_line",
    "proc_line",
    "write_state",
    "xid_line",
]
