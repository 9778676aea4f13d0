"""The supervised child that owns NVML for ``gpu.source.GpuSource``: one JSON line per request.

The only module that imports ``pynvml`` (``gpu.source`` never does): a crashing or hung call
takes down only this process. No policy: the parent classifies, checks, logs and restarts.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import BinaryIO, Final, Protocol, TypeVar

from exporter.sources.gpu.protocol import (
    REQUEST,
    GpuRecord,
    Hello,
    MigProcessRecord,
    MigRecord,
    ProcessRecord,
    Reply,
    encode,
)

# NVML return codes used here (nvml.h); the binding's NVMLError carries them as ``.value``.
_NO_PERMISSION: Final = 4
_FUNCTION_NOT_FOUND: Final = 13
_GPU_IS_LOST: Final = 15
_RESET_REQUIRED: Final = 16
_ARGUMENT_VERSION_MISMATCH: Final = 25
_INSUFFICIENT_SIZE: Final = 7
_NOT_SUPPORTED: Final = 3
_PCIE_UTIL_RX_BYTES: Final = 1
_NOT_AVAILABLE: Final = 2**64 - 1
#: Codes after which the GPU itself is gone, not just one field.
_DEVICE_DOWN: Final = {_GPU_IS_LOST: "gpu_lost", _RESET_REQUIRED: "reset_required"}
_PROCESS_APIS: Final = ("v3", "v2", "v1")


class _ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t``: the binding has no wrapper for the unversioned call any more."""

    _fields_ = (("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong))


class _DeviceDown(Exception):
    """A call said the whole GPU is gone (lost, or needs a reset)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


#: What an NVML call returns: the binding is untyped, so whatever the caller reads off it.
R = TypeVar("R")


@dataclass(slots=True)
class _Device:
    handle: object  # the binding's opaque device pointer
    uuid: str
    name: str


@dataclass(slots=True)
class Sampler:
    """Reads every GPU through the binding; versioned calls are resolved once per child."""

    nvml: ModuleType
    pcie: bool = True
    memory_v2: bool = True
    process_api: str | None = None
    #: False once the driver lacks the MIG calls (before R450): not asked again.
    mig: bool = True
    count: int = -1
    devices: dict[int, _Device] = field(default_factory=dict)
    identities: dict[int, tuple[str, str]] = field(default_factory=dict)
    health: _Health = field(init=False)

    def __post_init__(self) -> None:
        self.health = _Health(self)

    def sample(self) -> Reply:
        """One reply: every GPU, every compute process, or the code that stopped the listing."""
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as exc:
            return {"code": int(exc.value)}
        if count != self.count:  # GPUs came or went: indices may now name other devices
            self.count = count
            self.devices.clear()
            self.identities.clear()
            self.health.forget()
        gpus: list[GpuRecord] = []
        procs: list[ProcessRecord] = []
        migs: list[MigRecord] = []
        mig_procs: list[MigProcessRecord] = []
        xids = self.health.drain_events()
        for index in range(count):
            gpus.append(self._sample_gpu(index, procs))
            gpus[-1]["xids"] = xids.get(index, [])
            self._sample_migs(gpus[-1], procs, migs, mig_procs)
        return {
            "gpus": gpus,
            "procs": procs,
            "process_api": self.process_api,
            "migs": migs,
            "mig_procs": mig_procs,
        }

    def shutdown(self) -> None:
        """Release NVML before the child exits."""
        self.nvml.nvmlShutdown()

    def _sample_gpu(self, index: int, procs: list[ProcessRecord]) -> GpuRecord:
        try:
            device = self._device(index)
            gpu: GpuRecord = {"index": index, "uuid": device.uuid, "name": device.name, "up": True}
            self._memory(device.handle, gpu)
            self._utilization(device.handle, gpu)
            if self.pcie:
                gpu["pcie_rx_kb"] = self._field(
                    self.nvml.nvmlDeviceGetPcieThroughput, device.handle, _PCIE_UTIL_RX_BYTES
                )
            procs.extend((index, pid, used) for pid, used in self._processes(device.handle))
            self.health.read(index, device, gpu)
        except _DeviceDown as down:
            return self._down(index, down.error)
        except self.nvml.NVMLError as exc:
            # Handle or identity refused (e.g. NO_PERMISSION for a GPU outside our cgroup).
            return self._down(
                index, "no_permission" if exc.value == _NO_PERMISSION else "nvml_error"
            )
        return gpu

    # --- MIG ----------------------------------------------------------------------------------

    def _sample_migs(
        self,
        gpu: GpuRecord,
        procs: list[ProcessRecord],
        migs: list[MigRecord],
        mig_procs: list[MigProcessRecord],
    ) -> None:
        """MIG mode of an up GPU and, when on, each MIG device with its memory and processes.

        A process listed on a slice is taken off the whole GPU's list (a privileged caller
        gets the aggregate there too), so its memory counts once, on its slice.
        """
        index = gpu["index"]
        device = self.devices.get(index)
        if not self.mig or not gpu["up"] or device is None:
            return
        try:
            current, pending = self._call(self.nvml.nvmlDeviceGetMigMode, device.handle)
        except (_DeviceDown, self.nvml.NVMLError) as exc:
            # NOT_SUPPORTED: not MIG-capable; a lost GPU shows on the next sample.
            self.mig = getattr(exc, "value", None) != _FUNCTION_NOT_FOUND
            return
        gpu["mig_mode"], gpu["mig_pending"] = int(current), int(pending)
        if int(current) != 1:
            return
        found: list[MigRecord] = []
        on_slices: list[MigProcessRecord] = []
        try:
            for handle in self._mig_handles(device.handle):
                record = self._mig_record(index, handle)
                if record is not None:
                    found.append(record)
                    on_slices += [(index, record["uuid"], p, u) for p, u in self._processes(handle)]
        except _DeviceDown:
            return  # lost mid-listing: the next sample shows the GPU down
        migs += found
        mig_procs += on_slices
        pids = {record[2] for record in on_slices}
        procs[:] = [p for p in procs if p[0] != index or p[1] not in pids]

    def _mig_handles(self, handle: object) -> list[object]:
        """The GPU's MIG device handles; indices without a device (NOT_FOUND) are gaps."""
        count = self._field(self.nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        handles = []
        for slot in range(int(count)):
            mig = self._field(self.nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            if mig is not None:
                handles.append(mig)
        return handles

    def _mig_record(self, index: int, handle: object) -> MigRecord | None:
        """One MIG device's identity and memory; None when its identity is refused."""
        try:
            record: MigRecord = {
                "gpu": index,
                "uuid": str(self._call(self.nvml.nvmlDeviceGetUUID, handle)),
                "gi": int(self._call(self.nvml.nvmlDeviceGetGpuInstanceId, handle)),
                "ci": int(self._call(self.nvml.nvmlDeviceGetComputeInstanceId, handle)),
            }
        except self.nvml.NVMLError:
            return None
        # Drivers name a slice "<GPU name> MIG <profile>", e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
        name = self._field(self.nvml.nvmlDeviceGetName, handle)
        if name is not None and " MIG " in str(name):
            record["profile"] = str(name).rsplit(" MIG ", 1)[1]
        info = self._field(self.nvml.nvmlDeviceGetMemoryInfo, handle)
        if info is not None:
            record["used"], record["total"] = int(info.used), int(info.total)
        return record

    def _down(self, index: int, error: str) -> GpuRecord:
        self.devices.pop(index, None)
        uuid, name = self.identities.get(index, ("", ""))
        return {"index": index, "uuid": uuid, "name": name, "up": False, "error": error}

    def _device(self, index: int) -> _Device:
        device = self.devices.get(index)
        if device is None:
            handle = self._call(self.nvml.nvmlDeviceGetHandleByIndex, index)
            uuid = str(self._call(self.nvml.nvmlDeviceGetUUID, handle))
            name = str(self._call(self.nvml.nvmlDeviceGetName, handle))
            device = self.devices[index] = _Device(handle, uuid, name)
            self.identities[index] = (uuid, name)
        return device

    def _call(self, function: Callable[..., R], *args: object) -> R:
        """Call the binding; turn lost-GPU codes into ``_DeviceDown``, re-raise the rest."""
        try:
            return function(*args)
        except self.nvml.NVMLError as exc:
            if exc.value in _DEVICE_DOWN:
                raise _DeviceDown(_DEVICE_DOWN[exc.value]) from exc
            raise

    def _field(self, function: Callable[..., R], *args: object) -> R | None:
        """A value a GPU may not support: None instead of an error, never a fake 0."""
        try:
            return self._call(function, *args)
        except self.nvml.NVMLError:
            return None

    def _memory(self, handle: object, gpu: GpuRecord) -> None:
        if self.memory_v2:
            try:
                info = self._call(
                    self.nvml.nvmlDeviceGetMemoryInfo, handle, self.nvml.nvmlMemory_v2
                )
                gpu["used"], gpu["total"] = int(info.used), int(info.total)
                gpu["reserved"] = int(info.reserved)
                return
            except self.nvml.NVMLError as exc:
                # Drivers before R510 lack _v2 or reject its version: use v1 from now on.
                if exc.value in (_FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH):
                    self.memory_v2 = False
        info = self._field(self.nvml.nvmlDeviceGetMemoryInfo, handle)
        if info is not None:
            gpu["used"], gpu["total"] = int(info.used), int(info.total)

    def _utilization(self, handle: object, gpu: GpuRecord) -> None:
        rates = self._field(self.nvml.nvmlDeviceGetUtilizationRates, handle)
        if rates is not None:
            gpu["util"], gpu["mem_util"] = int(rates.gpu), int(rates.memory)

    def _processes(self, handle: object) -> list[tuple[int, int | None]]:
        if self.process_api == "none":
            return []
        for api in _PROCESS_APIS[_PROCESS_APIS.index(self.process_api or "v3") :]:
            try:
                records = self._call(self._process_function(api), handle)
            except self.nvml.NVMLError as exc:
                if exc.value == _FUNCTION_NOT_FOUND:
                    continue
                return []  # NOT_SUPPORTED (MIG), NO_PERMISSION: no records, not a failure
            self.process_api = api
            return [(int(r.pid), _memory_or_none(r.usedGpuMemory)) for r in records]
        self.process_api = "none"
        return []

    def _process_function(self, api: str) -> Callable[[object], list[_ProcessInfoV1]]:
        if api == "v1":
            return self._processes_v1
        function: Callable[[object], list[_ProcessInfoV1]] = getattr(
            self.nvml, f"nvmlDeviceGetComputeRunningProcesses_{api}"
        )
        return function

    def _processes_v1(self, handle: object) -> list[_ProcessInfoV1]:
        # nvidia-ml-py 12.535+ maps the unversioned name to _v3, so call the C symbol directly.
        function = self.nvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses")
        count = ctypes.c_uint(0)
        ret = function(handle, ctypes.byref(count), None)
        if ret != _INSUFFICIENT_SIZE:
            self.nvml._nvmlCheckReturn(ret)
            return []
        count.value = count.value * 2 + 5
        records = (_ProcessInfoV1 * count.value)()
        self.nvml._nvmlCheckReturn(function(handle, ctypes.byref(count), records))
        return list(records[: count.value])


# --- GPU health: Xid events, ECC, retired pages, remapped rows, throttle, PCIe link --------

#: nvml.h event types: critical Xid errors (the Xid code is the event's data).
_EVENT_XID: Final = 0x8
#: At most this many events are drained per sample; the rest wait for the next one.
_EVENTS_PER_SAMPLE: Final = 64
#: The first wait of a drain (ms): events already queued come back at once, and a sample
#: is never held up by more than this when there are none.
_EVENT_WAIT_MS: Final = 1


@dataclass(slots=True)
class _Health:
    """The health readings of every GPU; a reading a GPU or driver lacks is asked once only.

    FUNCTION_NOT_FOUND (an older driver lacks the symbol) and NOT_SUPPORTED (this GPU
    cannot) both leave the reading out of every later record and name it in ``unsupported``.
    """

    sampler: Sampler
    event_set: object | None = None
    events_missing: bool = False
    registered: set[int] = field(default_factory=set)
    addresses: dict[int, int] = field(default_factory=dict)  # handle address -> GPU index
    handles_tried: set[int] = field(default_factory=set)  # addresses asked to register
    handles_listening: set[int] = field(default_factory=set)  # ... and registered
    unsupported: dict[int, set[str]] = field(default_factory=dict)
    throttle_api: str = "nvmlDeviceGetCurrentClocksEventReasons"

    def forget(self) -> None:
        """GPUs came or went: register and probe every GPU again."""
        self.registered.clear()
        self.addresses.clear()
        self.unsupported.clear()

    def read(self, index: int, device: _Device, gpu: GpuRecord) -> None:
        """Add this GPU's health fields to ``gpu``; a lost GPU raises ``_DeviceDown``."""
        nvml, handle = self.sampler.nvml, device.handle
        self._register(index, handle)
        ecc = self._ask(
            index,
            "ecc",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        if ecc is not None:
            gpu["ecc_uncorrected"] = int(ecc)
        pending = self._ask(
            index, "retired_pages", nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle
        )
        if pending is not None:
            gpu["retired_pending"] = bool(pending)
        rows = self._ask(index, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            gpu["remap"] = [int(value) for value in rows]
        throttle = self._throttle(index, handle)
        if throttle is not None:
            gpu["throttle"] = throttle
        link = self._pcie_link(index, handle)
        if link is not None:
            gpu["pcie_link"] = link
        gpu["unsupported"] = sorted(self.unsupported.get(index, ()))

    def _ask(self, index: int, reading: str, function: Callable[..., R], *args: object) -> R | None:
        """One call; None when the reading is unsupported (remembered) or failed this time."""
        if reading in self.unsupported.get(index, ()):
            return None
        try:
            return self.sampler._call(function, *args)
        except self.sampler.nvml.NVMLError as exc:
            if exc.value in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                self.unsupported.setdefault(index, set()).add(reading)
            return None

    def _throttle(self, index: int, handle: object) -> int | None:
        # Drivers before R535 only have the older name of the same call.
        function = getattr(self.sampler.nvml, self.throttle_api)
        try:
            reasons = self.sampler._call(function, handle)
        except self.sampler.nvml.NVMLError as exc:
            older = "nvmlDeviceGetCurrentClocksThrottleReasons"
            if exc.value == _FUNCTION_NOT_FOUND and self.throttle_api != older:
                self.throttle_api = older
                return self._throttle(index, handle)
            if exc.value in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                self.unsupported.setdefault(index, set()).add("throttle")
            return None
        return int(reasons)

    def _pcie_link(self, index: int, handle: object) -> list[int] | None:
        nvml = self.sampler.nvml
        values = []
        for function in (
            nvml.nvmlDeviceGetCurrPcieLinkGeneration,
            nvml.nvmlDeviceGetMaxPcieLinkGeneration,
            nvml.nvmlDeviceGetCurrPcieLinkWidth,
            nvml.nvmlDeviceGetMaxPcieLinkWidth,
        ):
            value = self._ask(index, "pcie_link", function, handle)
            if value is None:
                return None
            values.append(int(value))
        return values

    def _register(self, index: int, handle: object) -> None:
        """Register the GPU for Xid events once; a driver without the event API says so.

        A handle stays registered when GPUs come or go (NVML keeps handles), so it is never
        registered twice; only its index is looked up again.
        """
        if index in self.registered:
            return
        self.registered.add(index)
        address = _address(handle)
        self.addresses[address] = index
        nvml = self.sampler.nvml
        if self.event_set is None and not self.events_missing:
            try:
                self.event_set = nvml.nvmlEventSetCreate()
            except nvml.NVMLError:
                self.events_missing = True  # FUNCTION_NOT_FOUND on old drivers, or refused
        if self.event_set is not None and address not in self.handles_tried:
            self.handles_tried.add(address)
            try:
                self.sampler._call(
                    nvml.nvmlDeviceRegisterEvents, handle, _EVENT_XID, self.event_set
                )
                self.handles_listening.add(address)
            except nvml.NVMLError:
                pass  # NOT_SUPPORTED on this GPU (some MIG and consumer parts)
        if address not in self.handles_listening:
            self.unsupported.setdefault(index, set()).add("xid_events")

    def drain_events(self) -> dict[int, list[int]]:
        """The Xid codes queued since the last sample, by GPU index; never waits long."""
        found: dict[int, list[int]] = {}
        if self.event_set is None:
            return found
        nvml = self.sampler.nvml
        wait = _EVENT_WAIT_MS
        for _ in range(_EVENTS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait_v2(self.event_set, wait)
            except nvml.NVMLError:
                break  # TIMEOUT: the queue is empty; anything else: try again next sample
            wait = 0
            index = self._index_of(data.device)
            if index is not None and int(data.eventType) & _EVENT_XID:
                found.setdefault(index, []).append(int(data.eventData))
        return found

    def _index_of(self, device: object) -> int | None:
        """The GPU an event names: by its handle, else by asking NVML for its index."""
        index = self.addresses.get(_address(device))
        if index is None:
            nvml = self.sampler.nvml
            try:
                index = int(nvml.nvmlDeviceGetIndex(device))
            except nvml.NVMLError:
                return None
        return index


def _address(handle: object) -> int:
    """A device handle's pointer value: event data names its GPU by the same pointer."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)  # type: ignore[arg-type]


def _memory_or_none(value: int | None) -> int | None:
    """NVML says "not available" (WDDM, some MIG setups) with all bits set."""
    return None if value is None or value == _NOT_AVAILABLE else int(value)


def _describe_binding(nvml: ModuleType, hello: Hello) -> None:
    """Which binding file got imported, and which wheels claim it (both may be installed)."""
    from importlib import metadata

    wheels: dict[str, str] = {}
    for dist in ("nvidia-ml-py", "pynvml"):
        try:
            wheels[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    hello["binding_path"] = str(getattr(nvml, "__file__", ""))
    hello["binding_wheels"] = wheels


def _hello(describe: bool) -> tuple[Hello, Sampler | None]:
    try:
        import pynvml
    except ImportError as exc:
        return {"ok": False, "code": None, "message": str(exc)}, None
    try:
        pynvml.nvmlInit()
        driver = str(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError as exc:
        return {"ok": False, "code": int(exc.value), "message": str(exc)}, None
    hello: Hello = {"ok": True, "driver": driver}
    if describe:
        _describe_binding(pynvml, hello)
    return hello, Sampler(pynvml, pcie="--no-pcie" not in sys.argv)


class ChildSampler(Protocol):
    """What a GPU vendor's child answers requests with."""

    def sample(self) -> Reply:
        """One reply: every GPU and process, or the code that stopped the listing."""
        ...

    def shutdown(self) -> None:
        """Release the vendor library before the child exits."""
        ...


def serve(replies: BinaryIO, hello: Hello, sampler: ChildSampler | None) -> int:
    """Say hello, then answer each request until stdin closes (every GPU vendor's child).

    Args:
        replies: from ``_protocol_stream()``, taken before the vendor's binding was imported.
        hello: the init result; without a sampler the child says it and exits.
        sampler: answers each request.
    """
    _send(replies, hello)
    if sampler is None:
        return 0
    for line in sys.stdin.buffer:
        if line == REQUEST:
            _send(replies, sampler.sample())
    sampler.shutdown()
    return 0


def _protocol_stream() -> BinaryIO:
    """Keep fd 1 for replies only: stray prints from C code go to stderr instead."""
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    return replies


def _send(stream: BinaryIO, message: Hello | Reply) -> None:
    stream.write(encode(message))


def main() -> int:
    """Say hello (NVML init result), then answer each request until stdin closes."""
    # The parent ends us by closing stdin; a terminal's Ctrl-C is its business, not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = _protocol_stream()
    return serve(replies, *_hello("--describe" in sys.argv))


if __name__ == "__main__":
    sys.exit(main())
