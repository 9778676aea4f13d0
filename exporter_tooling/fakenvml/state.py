"""The fake NVML's state file: its line format and its atomic rewrite.

The library re-reads the file on every call, so every writer replaces it whole (a reader never
sees half a file). The format is documented at the top of simulated_nvml.c.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

#: Env variable naming the state file the simulated library reads on every call.
STATE_ENV: Final = "SIMULATED_NVML_STATE"


def gpu_line(
    index: int,
    uuid: str,
    name: str,
    total_bytes: int,
    used_bytes: int,
    util: int = 0,
    mem_util: int = 0,
) -> str:
    """One ``gpu`` line: a GPU, its memory and its utilisation (``name`` without spaces)."""
    return f"gpu {index} {uuid} {name} {total_bytes} {used_bytes} {util} {mem_util}"


def proc_line(index: int, pid: int, used_bytes: int) -> str:
    """One ``proc`` line: process ``pid`` holds ``used_bytes`` on GPU ``index``."""
    return f"proc {index} {pid} {used_bytes}"


def mig_mode_line(index: int, current: bool, pending: bool | None = None) -> str:
    """One ``mig_mode`` line: GPU ``index`` is MIG-capable, MIG on or off (pending: after reset)."""
    return f"mig_mode {index} {int(current)} {int(current if pending is None else pending)}"


def mig_line(
    index: int,
    uuid: str,
    gpu_instance: int,
    compute_instance: int,
    total_bytes: int,
    used_bytes: int,
    profile: str = "1g.10gb",
) -> str:
    """One ``mig`` line: a MIG device of GPU ``index`` (listed in MIG index order)."""
    return (
        f"mig {index} {uuid} {gpu_instance} {compute_instance} {total_bytes} {used_bytes} {profile}"
    )


def mig_proc_line(mig_uuid: str, pid: int, used_bytes: int) -> str:
    """One ``mig_proc`` line: process ``pid`` holds ``used_bytes`` on MIG device ``mig_uuid``."""
    return f"mig_proc {mig_uuid} {pid} {used_bytes}"


def write_state(path: Path, lines: Sequence[str]) -> None:
    """Replace the simulated NVML state file atomically (the library re-reads it every call).

    Args:
        path: the file named by ``SIMULATED_NVML_STATE``.
        lines: ``gpu``/``proc``/fault lines as documented at the top of simulated_nvml.c.
    """
    write_atomically(path, "".join(f"{line}\n" for line in lines).encode())


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` through a temporary file beside it and a rename.

    The temporary name is unique per process and thread, so concurrent writers never share
    one; it is created with the umask's mode, so an exporter run as another user can read it.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


# --- GPU health lines (simulated_nvml.c's "health" block) ----------------------------------


def xid_line(index: int, code: int) -> str:
    """One ``xid`` line: one critical Xid event on GPU ``index``, delivered once.

    The library counts what it delivered per GPU, so a writer keeps earlier ``xid`` lines
    and appends new ones; removing lines does not re-deliver or undo anything.
    """
    return f"xid {index} {code}"


def health_lines(
    index: int,
    *,
    ecc_uncorrected: int = 0,
    retired_pending: bool = False,
    remap: tuple[int, int, int, int] = (0, 0, 0, 0),
    throttle: int = 0,
    pcie_link: tuple[int, int, int, int] = (5, 5, 16, 16),
) -> list[str]:
    """The health lines of GPU ``index``: ECC, retired pages, remapped rows, throttle, PCIe.

    Args:
        index: the GPU.
        ecc_uncorrected: volatile uncorrected ECC errors.
        retired_pending: pages wait to be retired (at the next GPU reset).
        remap: remapped rows (correctable, uncorrectable, pending, failure).
        throttle: clocks event reasons bitmask (nvml.h ``nvmlClocksEventReason*``).
        pcie_link: PCIe link (generation, max generation, width, max width).
    """
    return [
        f"ecc {index} {ecc_uncorrected}",
        f"retired_pending {index} {int(retired_pending)}",
        f"remap {index} {' '.join(map(str, remap))}",
        f"throttle {index} {throttle}",
        f"pcie_link {index} {' '.join(map(str, pcie_link))}",
    ]
