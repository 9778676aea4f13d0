"""The supervised child that owns amd-smi for ``amd.source``: one JSON line per request.

The only module that imports ``amdsmi`` (the binding loads ``libamd_smi.so`` when imported, and
a crashing or hung call takes down only this process). It speaks the NVML child's protocol, so
the parent supervises both the same way. No policy: the parent classifies, logs and restarts.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Final, TypeVar

from exporter.sources.gpu.amd.protocol import LIBRARY_NOT_LOADED
from exporter.sources.gpu.nvidia.worker import _protocol_stream, serve
from exporter.sources.gpu.protocol import GpuRecord, Hello, ProcessRecord, Reply

#: Status codes (amdsmi_status_t) after which the processor itself is unusable.
_NO_PERMISSION: Final = 10
#: What the binding's dictionaries hold for a field the GPU does not report.
_NOT_AVAILABLE: Final = "N/A"

R = TypeVar("R")


@dataclass(slots=True)
class Sampler:
    """Reads every AMD GPU through the binding, in the binding's enumeration order."""

    smi: ModuleType

    def sample(self) -> Reply:
        """One reply: every GPU, every process holding VRAM, or the listing's status code."""
        try:
            handles = list(self.smi.amdsmi_get_processor_handles())
        except self.smi.AmdSmiLibraryException as exc:
            return {"code": int(exc.get_error_code())}
        gpus: list[GpuRecord] = []
        procs: list[ProcessRecord] = []
        for index, handle in enumerate(handles):
            gpus.append(self._sample_gpu(index, handle, procs))
        return {"gpus": gpus, "procs": procs, "process_api": "amdsmi_get_gpu_process_list"}

    def shutdown(self) -> None:
        """Release amd-smi before the child exits."""
        self.smi.amdsmi_shut_down()

    def _sample_gpu(self, index: int, handle: object, procs: list[ProcessRecord]) -> GpuRecord:
        try:
            uuid = str(self.smi.amdsmi_get_gpu_device_uuid(handle))
        except self.smi.AmdSmiLibraryException as exc:
            error = "no_permission" if exc.get_error_code() == _NO_PERMISSION else "amdsmi_error"
            return {"index": index, "uuid": "", "name": "", "up": False, "error": error}
        asic = self._field(self.smi.amdsmi_get_gpu_asic_info, handle) or {}
        gpu: GpuRecord = {
            "index": index,
            "uuid": uuid,
            "name": str(asic.get("market_name", _NOT_AVAILABLE)),
            "up": True,
        }
        vram = self.smi.AmdSmiMemoryType.VRAM
        total = self._field(self.smi.amdsmi_get_gpu_memory_total, handle, vram)
        used = self._field(self.smi.amdsmi_get_gpu_memory_usage, handle, vram)
        if total is not None and used is not None:
            gpu["total"], gpu["used"] = int(total), int(used)
        activity = self._field(self.smi.amdsmi_get_gpu_activity, handle) or {}
        for key, name in (("util", "gfx_activity"), ("mem_util", "umc_activity")):
            value = activity.get(name, _NOT_AVAILABLE)
            if value != _NOT_AVAILABLE:
                gpu[key] = int(value)  # type: ignore[literal-required]  # "util" or "mem_util"
        ecc = self._field(self.smi.amdsmi_get_gpu_total_ecc_count, handle)
        if ecc is not None:
            # RAS totals since the driver loaded: what NVML calls the volatile count
            gpu["ecc_uncorrected"] = int(ecc["uncorrectable_count"])
        listed = self._field(self.smi.amdsmi_get_gpu_process_list, handle) or []
        procs.extend((index, int(p["pid"]), _vram(p)) for p in listed)
        return gpu

    def _field(self, function: Callable[..., R], *args: object) -> R | None:
        """A value a GPU may not support: None instead of an error, never a fake 0."""
        try:
            return function(*args)
        except self.smi.AmdSmiLibraryException:
            return None


def _vram(process: dict[str, object]) -> int | None:
    """VRAM a process holds; the binding says "N/A" where the driver does not account it."""
    usage = process.get("memory_usage")
    value = usage.get("vram_mem") if isinstance(usage, dict) else None
    return int(value) if isinstance(value, int) else None


def _describe_binding(smi: ModuleType, hello: Hello) -> None:
    from importlib import metadata

    try:
        hello["binding_wheels"] = {"amdsmi": metadata.version("amdsmi")}
    except metadata.PackageNotFoundError:
        hello["binding_wheels"] = {}
    hello["binding_path"] = str(getattr(smi, "__file__", ""))


def _hello(describe: bool) -> tuple[Hello, Sampler | None]:
    try:
        import amdsmi
    except ImportError as exc:
        return {"ok": False, "code": None, "message": str(exc)}, None
    except (KeyError, OSError) as exc:
        # The binding prints why and then fails on its missing library entry.
        return {"ok": False, "code": LIBRARY_NOT_LOADED, "message": repr(exc)}, None
    try:
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        version = amdsmi.amdsmi_get_lib_version()
    except amdsmi.AmdSmiLibraryException as exc:
        return {"ok": False, "code": int(exc.get_error_code()), "message": str(exc)}, None
    hello: Hello = {"ok": True, "driver": "amdsmi {major}.{minor}.{release}".format(**version)}
    if describe:
        _describe_binding(amdsmi, hello)
    return hello, Sampler(amdsmi)


def main() -> int:
    """Say hello (amd-smi init result), then answer each request until stdin closes."""
    # The parent ends us by closing stdin; a terminal's Ctrl-C is its business, not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = _protocol_stream()  # before the binding's import prints anything
    return serve(replies, *_hello("--describe" in sys.argv))


if __name__ == "__main__":
    sys.exit(main())
