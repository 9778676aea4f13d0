"""Real-GPU check: a child allocates GPU memory; the GPU source must attribute it to that child.

Run through tests/gpu/check_real_gpu.sh on a host with an NVIDIA driver or AMD's ROCm (each
vendor whose library is found is checked; ``--vendor`` picks one). Exit 0 on PASS, 1 on FAIL,
each with one clear last line. ``--simulate`` runs the same path on both simulated libraries
(the child then "allocates" by writing its pid into the simulated state) to check the plumbing.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exporter.base.errors import SourceError
from exporter.base.model import GpuReading, GpuSample
from exporter.core.observe import attribute_gpu_memory
from exporter.sources.gpu.amd.source import AmdGpuSource, amdsmi_library_present
from exporter.sources.gpu.protocol import HEALTH_READINGS
from exporter.sources.gpu.source import GpuSource
from exporter_tooling import fakeamdsmi, fakenvml
from exporter_tooling.fakenvml import health_lines, write_state, xid_line

# The child tries torch, then the CUDA runtime, then HIP (ROCm), then the CUDA driver API
# (libcuda ships with the driver, so the last one works on any host where NVML does).
ALLOCATE = r"""
import ctypes, os, sys
size = int(sys.argv[1])
def with_torch():
    import torch
    return torch.empty(size, dtype=torch.uint8, device="cuda:0"), "torch"
def with_cudart():
    for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.11.0"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        ptr = ctypes.c_void_p()
        if lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0:
            return ptr, name
    raise OSError("no usable libcudart")
def with_hip():
    lib = ctypes.CDLL("libamdhip64.so")
    ptr = ctypes.c_void_p()
    if lib.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)) != 0:
        raise OSError("hipMalloc failed")
    return ptr, "libamdhip64.so"
def with_driver_api():
    lib = ctypes.CDLL("libcuda.so.1")
    device, context, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for call in (lambda: lib.cuInit(0), lambda: lib.cuDeviceGet(ctypes.byref(device), 0),
                 lambda: lib.cuCtxCreate_v2(ctypes.byref(context), 0, device),
                 lambda: lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))):
        if call() != 0:
            raise OSError("CUDA driver API call failed")
    return ptr, "libcuda.so.1"
errors = []
for allocate in (with_torch, with_cudart, with_hip, with_driver_api):
    try:
        keep, how = allocate()
        break
    except Exception as exc:
        errors.append(f"{allocate.__name__}: {exc}")
else:
    print("error " + "; ".join(errors), flush=True)
    sys.exit(1)
print(f"ready {how}", flush=True)
sys.stdin.read()
"""

SIMULATED_ALLOCATE = r"""
import os, sys
size, state, gpus = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with open(state + ".tmp", "w") as f:
    for i in range(gpus):
        f.write(f"gpu {i} GPU-sim-{i} Simulated-GPU {80 << 30} {size + (600 << 20)} 30 10\n")
        f.write(f"proc {i} {os.getpid() if i == 0 else 1} {size + (500 << 20)}\n")
os.replace(state + ".tmp", state)
print("ready simulated", flush=True)
sys.stdin.read()
"""


def first_reading(source: GpuSource, *, within: float = 20.0) -> GpuReading:
    """Sample until NVML answers: a new child needs a moment, a failed one waits its backoff."""
    stop = time.monotonic() + within
    while True:
        try:
            return source.sample()
        except SourceError:
            if time.monotonic() > stop:
                raise
            time.sleep(0.02)


def start_allocator(size: int, state: Path | None, gpus: int) -> subprocess.Popen[str]:
    """Start the allocating child and wait until it holds the memory."""
    env = dict(
        os.environ,
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        CUDA_VISIBLE_DEVICES="0",
        HIP_VISIBLE_DEVICES="0",
    )
    argv = [sys.executable, "-c", ALLOCATE, str(size)]
    if state is not None:
        argv = [sys.executable, "-c", SIMULATED_ALLOCATE, str(size), str(state), str(gpus)]
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line.startswith("ready"):
        child.kill()
        child.wait()
        raise RuntimeError(f"the child could not allocate GPU memory ({line or 'no output'})")
    print(f"child pid={child.pid} allocated {size >> 20} MiB via {line.split(' ', 1)[1]}")
    return child


def verify(source: GpuSource, child_pid: int, size: int) -> tuple[bool, str]:
    """Sample NVML until the child's memory shows up attributed to it (NVML lags a little)."""
    stop = time.monotonic() + 20
    while True:
        reading = first_reading(source, within=30)
        attribution = attribute_gpu_memory(reading, {"check": [child_pid]})
        held = sum(attribution.per_target["check"].values())
        if held >= size:
            where = ", ".join(
                f"gpu {i}: {b >> 20} MiB" for i, b in attribution.per_target["check"].items()
            )
            return (
                True,
                f"PASS: {size >> 20} MiB allocated by pid {child_pid} attributed to it ({where})",
            )
        if time.monotonic() > stop:
            hint = ""
            if attribution.unattributed_pids:
                hint = " (pids outside our pid namespace are listed: run in the host pid namespace)"
            return (
                False,
                f"FAIL: pid {child_pid} holds {held} bytes by {source.name}, "
                f"expected >= {size}{hint}",
            )
        time.sleep(0.5)


def print_migs(reading: GpuReading | None, child_pid: int) -> None:
    """MIG mode per GPU and each MIG device, with the child's memory on it (real MIG hosts)."""
    if reading is None:
        return
    for gpu in reading.gpus:
        if gpu.mig_enabled is not None:
            print(f"gpu {gpu.index} mig_enabled={gpu.mig_enabled} mig_pending={gpu.mig_pending}")
    held = attribute_gpu_memory(reading, {"check": [child_pid]}).per_target_mig.get("check", {})
    for mig in reading.migs:
        print(
            f"mig {mig.uuid} gpu={mig.gpu_index} gi={mig.gpu_instance_id} "
            f"ci={mig.compute_instance_id} profile={mig.profile} used={mig.memory_used_bytes} "
            f"total={mig.memory_total_bytes} child={held.get(mig.uuid, 0)}"
        )


def report_timing(source: GpuSource, samples: int) -> None:
    """Print how long one sample of this host's GPUs takes through the child."""
    durations = []
    for _ in range(samples):
        started = time.perf_counter()
        source.sample()
        durations.append(time.perf_counter() - started)
    gpus = len(source.last_reading.gpus) if source.last_reading else 0
    median = statistics.median(durations) * 1000
    print(f"sample of {gpus} GPUs: median={median:.3f} ms over {samples} samples")


def describe_health(gpu: GpuSample) -> str:
    """One line: what each health call returned on this GPU, or that it is unsupported."""
    throttle = gpu.throttle_reasons
    values = {
        "xid_events": f"registered, counts={dict(gpu.xid_counts)}",
        "ecc": f"uncorrected_volatile={gpu.ecc_uncorrected_volatile}",
        "retired_pages": f"pending={gpu.retired_pages_pending}",
        "remapped_rows": f"uncorrectable={gpu.remapped_rows_uncorrectable} "
        f"pending={gpu.remapped_rows_pending} failed={gpu.remapped_rows_failed}",
        "throttle": f"reasons={None if throttle is None else hex(throttle)}",
        "pcie_link": f"gen={gpu.pcie_link_generation}/{gpu.pcie_link_generation_max} "
        f"width={gpu.pcie_link_width}/{gpu.pcie_link_width_max}",
    }
    said = [
        f"{name}: {'unsupported' if name in gpu.unsupported else values[name]}"
        for name in HEALTH_READINGS
    ]
    return f"gpu {gpu.index} health " + "; ".join(said)


def check_simulated_health(source: GpuSource, state: Path) -> str | None:
    """Queue an Xid 79 and sick readings on simulated GPU 0; None when all came through."""
    sick = health_lines(
        0, ecc_uncorrected=2, remap=(0, 1, 1, 0), throttle=0x80, pcie_link=(4, 5, 8, 16)
    )
    lines = state.read_text().splitlines()
    write_state(state, [*lines, *sick, xid_line(0, 79)])
    gpu = first_reading(source).gpus[0]
    got = (gpu.xids, gpu.ecc_uncorrected_volatile, gpu.remapped_rows_pending, gpu.throttle_reasons)
    got += (gpu.pcie_link_generation, gpu.pcie_link_width)
    want = ((79,), 2, True, 0x80, 4, 8)
    return None if got == want else f"FAIL: simulated GPU health read {got}, expected {want}"


#: Per vendor: its source, its fake library's state variable and builder (for --simulate).
VENDORS = {
    "nvidia": (GpuSource, fakenvml.STATE_ENV, fakenvml.build_simulated_nvml),
    "amd": (AmdGpuSource, fakeamdsmi.STATE_ENV, fakeamdsmi.build_simulated_amdsmi),
}


def vendors_to_check(vendor: str | None, simulate: bool) -> list[str]:
    """The vendor asked for; else both when simulating; else each whose library is here."""
    if vendor is not None:
        return [vendor]
    if simulate:
        return list(VENDORS)
    found = ["nvidia"] if ctypes.util.find_library("nvidia-ml") else []
    found += ["amd"] if amdsmi_library_present() else []
    return found or ["nvidia"]  # neither: NVML's own failure says what is missing


def check(vendor: str, args: argparse.Namespace, work: Path) -> tuple[bool, str]:
    """One vendor's check: allocate, attribute, print each GPU and the sample timing."""
    source_class, state_env, build = VENDORS[vendor]
    state = library_dir = None
    if args.simulate:
        state = work / "state"
        write_state(state, [])
        os.environ[state_env] = str(state)
        library_dir = str(build(work / "lib").parent)
    try:
        child = start_allocator(args.bytes, state, args.gpus)
    except RuntimeError as exc:
        return False, f"FAIL: {exc}"
    try:
        with source_class(library_dir=library_dir, call_timeout=5.0) as source:
            ok, verdict = verify(source, child.pid, args.bytes)
            for gpu in source.last_reading.gpus if source.last_reading else ():
                print(
                    f"{vendor} gpu {gpu.index} {gpu.name} used={gpu.memory_used_bytes} "
                    f"total={gpu.memory_total_bytes} util={gpu.utilization_ratio} "
                    f"pcie_rx={gpu.pcie_rx_bytes_per_second}"
                )
                # On a real host an unsupported call is reported, never a failure.
                if vendor == "nvidia":
                    print(f"{vendor} {describe_health(gpu)}")
                else:  # amd-smi gives RAS totals only; the rest is NVML's
                    print(
                        f"{vendor} gpu {gpu.index} ecc_uncorrected={gpu.ecc_uncorrected_volatile}"
                    )
            if ok and state is not None and vendor == "nvidia":
                failed = check_simulated_health(source, state)
                ok, verdict = (False, failed) if failed else (ok, verdict)
            print_migs(source.last_reading, child.pid)
            report_timing(source, args.samples)
    except SourceError as exc:
        ok, verdict = False, f"FAIL: {vendor} GPU source down reason={exc.reason} ({exc.detail})"
    finally:
        child.communicate(input="", timeout=30)
    return ok, verdict


def main() -> int:
    """Run the check for each vendor; the last printed line says PASS or FAIL."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bytes", type=int, default=1 << 30, help="GPU memory to allocate")
    parser.add_argument("--simulate", action="store_true", help="use the simulated libraries")
    parser.add_argument("--vendor", choices=sorted(VENDORS), help="check only this vendor")
    parser.add_argument("--gpus", type=int, default=1, help="simulated GPUs (with --simulate)")
    parser.add_argument("--samples", type=int, default=200, help="samples to time")
    args = parser.parse_args()
    verdicts = []
    for vendor in vendors_to_check(args.vendor, args.simulate):
        with tempfile.TemporaryDirectory() as work:
            verdicts.append(check(vendor, args, Path(work)))
            print(f"{vendor}: {verdicts[-1][1]}")
    failed = [verdict for ok, verdict in verdicts if not ok]
    print(failed[0] if failed else verdicts[-1][1])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
