"""The messages across the NVML child's pipe, typed once for both ends.

One JSON object per line. The child (``nvidia.worker``, or ``amd.worker``) says ``Hello``
once, then answers each ``REQUEST`` with a ``Reply``. The parent (``source.GpuSource``) reads
them as these types and converts every field it uses, so a child that writes something else
is a protocol error there, never a wrong number. Only the standard library here: the child
imports this before ``pynvml``.
"""

from __future__ import annotations

import json
from typing import Final, Required, TypedDict

#: The parent's request; anything else on the child's stdin is ignored. EOF ends the child.
REQUEST: Final = b"sample\n"


class Hello(TypedDict, total=False):
    """The child's first line: whether ``nvmlInit`` worked, and with which driver and binding.

    ``code`` is NVML's return code when init failed (None: the binding is not installed).
    """

    ok: Required[bool]
    driver: str
    code: int | None
    message: str
    binding_path: str
    binding_wheels: dict[str, str]


#: The health readings a GPU may lack, as ``GpuRecord.unsupported`` names them.
HEALTH_READINGS: Final = (
    "xid_events",
    "ecc",
    "retired_pages",
    "remapped_rows",
    "throttle",
    "pcie_link",
)


class GpuRecord(TypedDict, total=False):
    """One GPU in a reply; a field the GPU does not support is absent or None, never 0."""

    index: Required[int]
    uuid: Required[str]
    name: Required[str]
    up: Required[bool]
    used: int
    total: int
    reserved: int
    util: int
    mem_util: int
    pcie_rx_kb: int | None
    error: str
    #: MIG mode now and after a reset (0/1); absent where the GPU cannot do MIG.
    mig_mode: int
    mig_pending: int
    # GPU health (``nvidia.worker``'s ``_Health``): each absent when the GPU or driver lacks it.
    xids: list[int]  # Xid codes of the critical-error events drained in this sample
    ecc_uncorrected: int  # volatile uncorrected ECC errors since the driver loaded
    retired_pending: bool
    remap: list[int]  # remapped rows: correctable, uncorrectable, pending, failure
    throttle: int  # clocks event reasons bitmask
    pcie_link: list[int]  # current gen, max gen, current width, max width
    unsupported: list[str]  # health readings this GPU or driver cannot give (HEALTH_READINGS)


#: One compute process: gpu index, pid, used bytes (None: not available). It crosses the
#: pipe as a JSON array, so the parent unpacks a list: read it only by unpacking.
ProcessRecord = tuple[int, int, int | None]


class MigRecord(TypedDict, total=False):
    """One MIG device of a MIG-enabled GPU; memory absent when its call failed."""

    gpu: Required[int]
    uuid: Required[str]
    gi: Required[int]
    ci: Required[int]
    profile: str
    used: int
    total: int


#: A compute process on a MIG device: parent gpu index, MIG UUID, pid, used bytes (None: not
#: available). A JSON array like ``ProcessRecord``; the pid is listed here, not in ``procs``.
MigProcessRecord = tuple[int, str, int, int | None]


class Reply(TypedDict, total=False):
    """The answer to one request: every GPU and compute process, or the listing's NVML code."""

    gpus: list[GpuRecord]
    procs: list[ProcessRecord]
    process_api: str | None
    code: int
    migs: list[MigRecord]
    mig_procs: list[MigProcessRecord]


def encode(message: Hello | Reply) -> bytes:
    """One message as the line that carries it."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode_object(line: bytes) -> dict[str, object] | None:
    """A line as a JSON object; None when it is not one (the caller says protocol error)."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
