"""A fake ``libamd_smi.so`` for hosts without an AMD GPU: its C source, its builder, its state.

The library answers the amd-smi calls the exporter makes from the text file named by
``SIMULATED_AMDSMI_STATE`` (the fake NVML's ``gpu``/``proc`` lines plus ``ecc`` and faults);
the real ``amdsmi`` binding from PyPI loads it unchanged.
"""

from exporter_tooling.fakeamdsmi.build import LIBRARY_NAME, binding_symbols, build_simulated_amdsmi
from exporter_tooling.fakeamdsmi.state import STATE_ENV, ecc_line

__all__ = ["LIBRARY_NAME", "STATE_ENV", "binding_symbols", "build_simulated_amdsmi", "ecc_line"]
