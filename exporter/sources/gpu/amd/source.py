"""AMD GPUs: amd-smi sampled in a supervised child (``amd.worker``), supervised like NVML's.

``AmdGpuSource`` is ``GpuSource`` with the AMD child: the same deadline, backoff, process
checks and PID-namespace visibility, so per-process VRAM joins targets exactly like NVML's.
Its RAS totals arrive as the shared ECC field; it marks its GPUs ``vendor="amd"``.
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

from exporter.base.model import GpuReading
from exporter.sources.gpu.amd.protocol import LIBRARY_NOT_LOADED
from exporter.sources.gpu.protocol import Reply
from exporter.sources.gpu.source import GpuSource, NvmlReason, _child_env

LIBRARY_NAME: Final = "libamd_smi.so"

# amdsmi_status_t values (amdsmi.h) that say why amd-smi cannot be used at all.
_CODE_REASONS: Final[dict[int, NvmlReason]] = {
    LIBRARY_NOT_LOADED: NvmlReason.LIBRARY_NOT_FOUND,
    10: NvmlReason.NO_PERMISSION,
    34: NvmlReason.DRIVER_NOT_LOADED,
}

_HINTS: Final[dict[NvmlReason, str]] = {
    NvmlReason.LIBRARY_NOT_FOUND: "no libamd_smi.so: on a host without AMD GPUs set amdsmi = "
    "false in [exporter]; otherwise install amd-smi-lib (ROCm), set ROCM_PATH, or point "
    "amdsmi_library_dir at it",
    NvmlReason.DRIVER_NOT_LOADED: "the amdgpu kernel module is not loaded: check lsmod and dmesg",
    NvmlReason.NO_PERMISSION: "cannot open /dev/kfd or /dev/dri/*: add the user to the video "
    "and render groups, or check the unit's DeviceAllow=",
    NvmlReason.BINDING_MISSING: "the amdsmi module is missing: pip install amdsmi, or set "
    "amdsmi = false in [exporter]",
    NvmlReason.TIMEOUT: "an amd-smi call hung (driver stuck?): the child is killed and restarted",
    NvmlReason.CRASHED: "the amd-smi child died (segfault?): it is restarted with backoff",
}


def amdsmi_library_present(library_dir: str | None = None) -> bool:
    """Whether a ``libamd_smi.so`` is where the ``amdsmi`` binding looks for one.

    The binding's order: ``ROCM_HOME``/``ROCM_PATH`` ``/lib``, the loader path, then
    ``/opt/rocm/lib``; ``library_dir`` (config ``amdsmi_library_dir``) comes first.
    """
    roots = [os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH"), "/opt/rocm"]
    candidates = [Path(library_dir) / LIBRARY_NAME] if library_dir else []
    candidates += [Path(root) / "lib" / LIBRARY_NAME for root in roots if root]
    if any(path.exists() for path in candidates):
        return True
    return ctypes.util.find_library("amd_smi") is not None


class AmdGpuSource(GpuSource):
    """Samples every AMD GPU through amd-smi in a child process restarted when it fails.

    Same contract as ``GpuSource``: ``sample()`` answers within ``call_timeout`` or raises
    ``SourceError`` with an ``NvmlReason`` value (the reasons are vendor-neutral words).
    """

    name = "amdsmi"
    worker_module = "exporter.sources.gpu.amd.worker"
    code_reasons = _CODE_REASONS
    hints = _HINTS

    def __init__(
        self,
        *,
        library_dir: str | None = None,
        child_env: Mapping[str, str] | None = None,
        call_timeout: float = 0.5,
        init_timeout: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
    ) -> None:
        """Prepare the source; the child starts on the first ``sample()``.

        Args:
            library_dir: where ``libamd_smi.so`` is (a simulated one); it then wins over
                ``ROCM_PATH``. None: where the binding looks on its own.
            child_env: extra environment for the child, e.g. ``SIMULATED_AMDSMI_STATE``.
            call_timeout: most seconds one ``sample()`` waits for the child.
            init_timeout: most seconds a new child may take to import the binding and init.
            backoff_initial: first wait before restarting a failed child; doubles per failure.
            backoff_max: ceiling of that wait.
        """
        super().__init__(
            library_dir=library_dir,
            child_env=child_env,
            call_timeout=call_timeout,
            init_timeout=init_timeout,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        if library_dir is not None:
            # The binding tries ROCM_HOME/ROCM_PATH before the loader path: the configured
            # directory must win, as library_dir does for NVML.
            env = _child_env(library_dir, child_env or {})
            for name in ("ROCM_HOME", "ROCM_PATH"):
                env.pop(name, None)
            self._env = env

    def _accept(self, reply: Reply) -> GpuReading:
        reading = super()._accept(reply)
        gpus = tuple(replace(gpu, vendor="amd") for gpu in reading.gpus)
        self.last_reading = replace(reading, gpus=gpus)
        return self.last_reading
