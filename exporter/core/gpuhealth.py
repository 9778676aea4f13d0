"""GPU health as the lifecycle reads it: which Xid codes are kept, which are critical, and why.

Pure: no I/O. The NVML source reports the raw readings (Xid codes, ECC counts, a lost GPU);
this module names them for labels and decides which ones fail a cold start.

Xid codes come from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors). A code is
*critical* when the catalog's immediate action is a GPU reset, a node reboot or a hardware
report, or when it kills the application's context on a hardware fault: a start that saw one
will not become ready on that GPU. Codes that an application's own bug raises (13, 31, 43)
and informational ones (63: a row remap was recorded; 92: a high corrected-error rate) are
counted but decide nothing.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Final

from exporter.base.model import GpuSample

#: Xid codes kept as their own ``xid`` label value (the rest are ``other``): what each means.
XID_DESCRIPTIONS: Final[dict[int, str]] = {
    8: "GPU stopped processing",
    13: "Graphics engine exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing (application fault)",
    45: "Preemptive cleanup after a previous error",
    48: "Double-bit ECC error",
    61: "Internal micro-controller breakpoint",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remap recorded",
    64: "ECC page retirement or row remap failure",
    68: "Video processor exception",
    69: "Graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    140: "Unrecovered ECC error",
    143: "GPU initialization failure",
    154: "GPU recovery action changed",
}

#: Xid codes that fail a start on the GPU (reset, reboot or hardware report in the catalog).
CRITICAL_XIDS: Final = frozenset({48, 62, 64, 74, 79, 94, 95, 119, 120, 140, 143})

OTHER_XID: Final = "other"

#: NVML clocks event reason bits (nvml.h ``nvmlClocksEventReason*``) kept as ``reason`` labels.
THROTTLE_REASONS: Final[dict[str, int]] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}


def xid_label(code: int) -> str:
    """The bounded ``xid`` label of one Xid code: the code when well known, else ``other``."""
    return str(code) if code in XID_DESCRIPTIONS else OTHER_XID


def xid_label_counts(counts: Iterable[tuple[int, int]]) -> tuple[tuple[str, int], ...]:
    """Raw Xid counts by code folded into counts by ``xid`` label, sorted by label."""
    by_label: dict[str, int] = {}
    for code, count in counts:
        label = xid_label(code)
        by_label[label] = by_label.get(label, 0) + count
    return tuple(sorted(by_label.items()))


def throttle_active(reasons: int) -> dict[str, bool]:
    """Each kept throttle reason and whether its bit is set in NVML's bitmask."""
    return {name: bool(reasons & bit) for name, bit in THROTTLE_REASONS.items()}


def gpu_errors(gpus: Iterable[GpuSample], used: Container[int]) -> tuple[str, ...]:
    """The critical events of one sample on the GPUs in ``used``, worded for people.

    A lost GPU counts every sample it stays lost: a start on it cannot succeed.
    """
    found: list[str] = []
    for gpu in gpus:
        if gpu.index not in used:
            continue
        for code in gpu.xids:
            if code in CRITICAL_XIDS:
                found.append(f"Xid {code} on GPU {gpu.index} ({XID_DESCRIPTIONS[code]})")
        if gpu.ecc_uncorrected_new > 0:
            found.append(f"{gpu.ecc_uncorrected_new} uncorrectable ECC error(s) on GPU {gpu.index}")
        if not gpu.up and gpu.error == "gpu_lost":
            found.append(f"GPU {gpu.index} is lost (NVML_ERROR_GPU_IS_LOST)")
    return tuple(found)
