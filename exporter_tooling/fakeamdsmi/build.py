"""Builds the simulated ``libamd_smi.so`` (simulated_amdsmi.c) for the installed binding.

The ``amdsmi`` binding resolves every function it wraps when it is imported, so the library
must export all of them. The ones simulated_amdsmi.c does not answer are generated here as
stubs returning ``AMDSMI_STATUS_NOT_SUPPORTED``, read from the installed binding's wrapper
(read as text: importing it would look for the real library).
"""

from __future__ import annotations

import importlib.util
import re
from importlib import resources
from pathlib import Path
from typing import Final

from exporter_tooling.cbuild import CFLAGS, SimulatedLibraryBuildError, build_library

LIBRARY_NAME: Final = "libamd_smi.so"
_SOURCE: Final = "simulated_amdsmi.c"
_BOUND: Final = re.compile(rb"_libraries\['libamd_smi\.so'\]\.(\w+)")
_DEFINED: Final = re.compile(rb"^amdsmi_status_t (\w+)\(", re.MULTILINE)
_NOT_SUPPORTED: Final = 2


def binding_symbols() -> list[str]:
    """Every C function the installed ``amdsmi`` binding resolves at import, sorted.

    Raises:
        SimulatedLibraryBuildError: the binding is not installed.
    """
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or not spec.submodule_search_locations:
        raise SimulatedLibraryBuildError("the amdsmi binding is missing: pip install amdsmi")
    wrapper = Path(next(iter(spec.submodule_search_locations))) / "amdsmi_wrapper.py"
    return sorted({name.decode() for name in _BOUND.findall(wrapper.read_bytes())})


def build_simulated_amdsmi(out_dir: Path) -> Path:
    """Compile the simulated amd-smi into ``out_dir/libamd_smi.so`` unless already built.

    Args:
        out_dir: directory to hold the library; the AMD child's ``library_dir``.

    Raises:
        SimulatedLibraryBuildError: no binding, no ``cc`` on PATH, or the compiler failed.
    """
    source = resources.files("exporter_tooling.fakeamdsmi").joinpath(_SOURCE).read_bytes()
    defined = {name.decode() for name in _DEFINED.findall(source)}
    stubs = "".join(
        f"int {name}(void) {{ return {_NOT_SUPPORTED}; }}\n"
        for name in binding_symbols()
        if name not in defined
    )
    text = source + b"\n/* Generated: the binding's other functions. */\n" + stubs.encode()
    return build_library(text, _SOURCE, out_dir / LIBRARY_NAME, CFLAGS)
