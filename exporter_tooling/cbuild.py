"""Builds the simulated vendor libraries (fake NVML, fake amd-smi) with the system C compiler.

Used by the tests, the demo and the benchmark on hosts without a GPU; never loads a library.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

CFLAGS: Final = ("-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC")


class SimulatedLibraryBuildError(RuntimeError):
    """A simulated library could not be compiled (no compiler, or it failed)."""


def build_library(source: bytes, source_name: str, library: Path, flags: tuple[str, ...]) -> Path:
    """Compile ``source`` into ``library`` unless an identical build is already there.

    The build is cached by a hash of the source and the flags, recorded next to the library,
    and replaced atomically so concurrent builders never see half a file.

    Args:
        source: the C source text.
        source_name: its file name, for the compiler's messages.
        library: the shared object to write (its directory is created).
        flags: compiler flags (``CFLAGS`` plus a variant's ``-D`` flags).

    Raises:
        SimulatedLibraryBuildError: no ``cc`` on PATH, or the compiler failed.
    """
    digest = hashlib.sha256(source + "\0".join(flags).encode()).hexdigest()
    library.parent.mkdir(parents=True, exist_ok=True)
    stamp = library.with_name(f"{library.name}.sha256")
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return library
    # Imported here: the fake NVML package imports this module while it initialises.
    from exporter_tooling.fakenvml.state import write_atomically

    _compile(source, source_name, flags, library)
    write_atomically(stamp, digest.encode())
    log.debug("built simulated library path=%s", library)
    return library


def _compile(source: bytes, source_name: str, flags: tuple[str, ...], library: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SimulatedLibraryBuildError("no C compiler: install gcc (Debian: apt-get install gcc)")
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        source_path = Path(work) / source_name
        source_path.write_bytes(source)
        built = Path(work) / library.name
        result = subprocess.run(
            [compiler, *flags, "-o", str(built), str(source_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SimulatedLibraryBuildError(f"cc failed: {result.stderr.strip()[:2000]}")
        os.replace(built, library)
