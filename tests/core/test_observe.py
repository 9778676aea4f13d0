"""The observe stage: raw readings in, one observation per target out, with no I/O."""

from __future__ import annotations

from dataclasses import replace

from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import initial_state
from exporter.core.model import (
    DiskSample,
    GpuProcess,
    GpuReading,
    GpuSample,
    LogReading,
    MemoryPressure,
    ProcessSample,
    RawLogLine,
)
from exporter.core.observe import (
    TargetReadings,
    TargetWorld,
    attribute_gpu_memory,
    host_readings,
    observe,
)
from exporter.engines import ENGINES

GIB = 1 << 30
PROC = ProcessSample(10, 100.0, (10, 11), 1, 0.0, 0)
TRACEBACK = RawLogLine("Traceback (most recent call last):", 1.0)
CAUSE = RawLogLine("torch.OutOfMemoryError: CUDA out of memory", 2.0)


def world() -> TargetWorld:
    return TargetWorld(initial_state("vllm"), LogClassifier(ENGINES["vllm"].log))


def test_gpu_memory_is_joined_to_the_tree_filtered_and_stamped_with_the_tick():
    gpu = GpuReading(
        gpus=(GpuSample(0, "GPU-0", "H200", True), GpuSample(1, "GPU-1", "H200", True)),
        processes=(GpuProcess(0, 10, 3 * GIB), GpuProcess(1, 11, 5 * GIB), GpuProcess(1, 99, 1)),
    )
    attribution = attribute_gpu_memory(gpu, {"vllm": PROC.pids})
    host = host_readings({"disk": DiskSample(7, ("nvme0n1",))})

    seen = observe(
        "vllm", world(), TargetReadings(process=PROC), host, gpu, attribution, gpus={1}, now=42.0
    )

    assert seen.gpu_memory_bytes == ((1, 5 * GIB),)
    assert seen.observation.gpu_memory_bytes == 5 * GIB
    assert (seen.observation.at, seen.observation.disk_read_bytes) == (42.0, 7)
    assert attribution.foreign == {1: 1}


def test_a_new_engine_process_starts_a_new_log_story():
    w = world()
    w.state = replace(w.state, pid=PROC.pid, create_time=PROC.create_time)
    gpu = GpuReading(gpus=())
    none = attribute_gpu_memory(gpu, {})
    first = TargetReadings(process=PROC, logs=LogReading((TRACEBACK,)))
    observe("vllm", w, first, host_readings({}), gpu, none, gpus=None, now=1.0)
    restarted = replace(PROC, pid=20, create_time=200.0)

    seen = observe(
        "vllm", w, TargetReadings(process=restarted, logs=LogReading((CAUSE,))), host_readings({}),
        gpu, none, gpus=None, now=2.0,
    )  # fmt: skip

    # The old process' open traceback does not claim the new process' first line.
    (event,) = seen.observation.log_events
    assert event.text == CAUSE.text and event.line_no is None


def test_host_readings_keep_each_value_under_its_source_name_and_type():
    pressure = MemoryPressure(0.5, 0.25, 1.0, 0.5)
    host = host_readings(
        {"memory_pressure": pressure, "disk": "not a disk sample", "nvml": object()}
    )
    assert host.memory_pressure == pressure and host.disk is None
