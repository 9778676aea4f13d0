"""Builds the simulated ``libnvidia-ml.so.1`` (simulated_nvml.c) with the system C compiler.

Used by the tests, the demo and the benchmark on hosts without a GPU; never loads NVML itself.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Final

from exporter_tooling.cbuild import CFLAGS, SimulatedLibraryBuildError, build_library

LIBRARY_NAME: Final = "libnvidia-ml.so.1"
#: Build variants: extra compiler flags that remove symbols older drivers lack.
VARIANTS: Final[dict[str, tuple[str, ...]]] = {
    "default": (),
    "no_v3": ("-DNO_V3",),
    "no_v3_v2": ("-DNO_V3", "-DNO_V2"),
    "no_mig": ("-DNO_MIG",),
    "no_events": ("-DNO_EVENTS",),
}
_SOURCE: Final = "simulated_nvml.c"

#: The compile error; one class for every simulated library (see exporter_tooling.cbuild).
SimulatedNvmlBuildError = SimulatedLibraryBuildError


def build_simulated_nvml(out_dir: Path, *, variant: str = "default") -> Path:
    """Compile the simulated NVML into ``out_dir/libnvidia-ml.so.1`` unless already built.

    The build is cached by a hash of the source, the variant and the flags, recorded next to
    the library, and replaced atomically so concurrent builders never see half a file.

    Args:
        out_dir: directory to hold the library; put it on the NVML child's LD_LIBRARY_PATH.
        variant: one of ``VARIANTS`` ("no_v3" lacks ..._v3, "no_v3_v2" also lacks ..._v2,
            "no_mig" lacks every MIG call, "no_events" lacks the event API of Xid reports).

    Raises:
        ValueError: unknown variant.
        SimulatedNvmlBuildError: no ``cc`` on PATH, or the compiler failed.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown simulated NVML variant {variant!r}; known: {sorted(VARIANTS)}")
    source = resources.files("exporter_tooling.fakenvml").joinpath(_SOURCE).read_bytes()
    flags = (*CFLAGS, *VARIANTS[variant])
    return build_library(source, _SOURCE, out_dir / LIBRARY_NAME, flags)
