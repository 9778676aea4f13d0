"""Builds the simulated ``libnvidia-ml.so.1`` (simulated_nvml.c) with the system C compiler.

Used by the tests, the demo and the benchmark on hosts without a GPU; never loads NVML itself.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Final

from exporter_tooling.fakenvml.state import write_atomically

log = logging.getLogger(__name__)

LIBRARY_NAME: Final = "libnvidia-ml.so.1"
#: Build variants: extra compiler flags that remove symbols older drivers lack.
VARIANTS: Final[dict[str, tuple[str, ...]]] = {
    "default": (),
    "no_v3": ("-DNO_V3",),
    "no_v3_v2": ("-DNO_V3", "-DNO_V2"),
    "no_events": ("-DNO_EVENTS",),
}
_SOURCE: Final = "simulated_nvml.c"
_CFLAGS: Final = ("-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC")


class SimulatedNvmlBuildError(RuntimeError):
    """The simulated NVML library could not be compiled (no compiler, or it failed)."""


def build_simulated_nvml(out_dir: Path, *, variant: str = "default") -> Path:
    """Compile the simulated NVML into ``out_dir/libnvidia-ml.so.1`` unless already built.

    The build is cached by a hash of the source, the variant and the flags, recorded next to
    the library, and replaced atomically so concurrent builders never see half a file.

    Args:
        out_dir: directory to hold the library; put it on the NVML child's LD_LIBRARY_PATH.
        variant: one of ``VARIANTS`` ("no_v3" lacks ..._v3, "no_v3_v2" also lacks ..._v2,
                "no_events" lacks the event API of Xid reports).

    Raises:
        ValueError: unknown variant.
        SimulatedNvmlBuildError: no ``cc`` on PATH, or the compiler failed.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown simulated NVML variant {variant!r}; known: {sorted(VARIANTS)}")
    source = resources.files("exporter_tooling.fakenvml").joinpath(_SOURCE).read_bytes()
    flags = (*_CFLAGS, *VARIANTS[variant])
    digest = hashlib.sha256(source + "\0".join(flags).encode()).hexdigest()
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / LIBRARY_NAME
    stamp = out_dir / f"{LIBRARY_NAME}.sha256"
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return library
    _compile(source, flags, library)
    write_atomically(stamp, digest.encode())
    log.debug("built simulated nvml path=%s variant=%s", library, variant)
    return library


def _compile(source: bytes, flags: tuple[str, ...], library: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SimulatedNvmlBuildError("no C compiler: install gcc (Debian: apt-get install gcc)")
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        source_path = Path(work) / _SOURCE
        source_path.write_bytes(source)
        built = Path(work) / LIBRARY_NAME
        result = subprocess.run(
            [compiler, *flags, "-o", str(built), str(source_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SimulatedNvmlBuildError(f"cc failed: {result.stderr.strip()[:2000]}")
        os.replace(built, library)
