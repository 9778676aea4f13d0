"""The observe stage: raw readings in, one observation per target out, with no I/O."""

from __future__ import annotations

from dataclasses import replace

from exporter.base.model import (
    DiskSample,
    GpuProcess,
    GpuReading,
    GpuSample,
    LogClass,
    LogReading,
    MemoryPressure,
    MigSample,
    Phase,
    ProcessSample,
    RawLogLine,
)
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import Thresholds, initial_state, step
from exporter.core.observe import (
    TargetReadings,
    TargetWorld,
    attribute_gpu_memory,
    forget_departed,
    host_readings,
    note_instance,
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


MIG_A = "MIG-4b4c9a1e-6b0b-5e33-9c1f-3a5f0e2d7c11"
MIG_B = "MIG-8f2d6c3a-1e4b-5a77-b0c2-9d6e4f1a2b33"


def test_gpus_limited_by_gpu_uuid_or_mig_uuid_keep_the_whole_gpu_or_only_that_slice():
    # the tree (pids 10, 11) holds 3 GiB on slice A and 4 GiB on slice B of GPU 0, 5 on GPU 1
    gpu = GpuReading(
        gpus=(GpuSample(0, "GPU-0", "A100", True), GpuSample(1, "GPU-1", "A100", True)),
        processes=(
            GpuProcess(0, 10, 3 * GIB, mig_uuid=MIG_A),
            GpuProcess(0, 11, 4 * GIB, mig_uuid=MIG_B),
            GpuProcess(1, 11, 5 * GIB),
        ),
        migs=(MigSample(0, MIG_A, 1, 0), MigSample(0, MIG_B, 2, 0)),
    )
    attribution = attribute_gpu_memory(gpu, {"vllm": PROC.pids})
    readings, host = TargetReadings(process=PROC), host_readings({})

    def seen(gpus):
        return observe("vllm", world(), readings, host, gpu, attribution, gpus=gpus, now=1.0)

    assert attribution.per_target == {"vllm": {0: 7 * GIB, 1: 5 * GIB}}
    assert attribution.per_target_mig == {"vllm": {MIG_A: 3 * GIB, MIG_B: 4 * GIB}}
    everything = seen(None)
    assert everything.mig_memory_bytes == ((MIG_A, 3 * GIB), (MIG_B, 4 * GIB))
    assert everything.observation.gpu_memory_bytes == 12 * GIB
    one_slice = seen((MIG_B,))
    assert (one_slice.gpu_memory_bytes, one_slice.mig_memory_bytes) == (
        ((0, 4 * GIB),),
        ((MIG_B, 4 * GIB),),
    )
    assert one_slice.observation.gpu_memory_bytes == 4 * GIB
    whole = seen(("GPU-0",))
    assert whole.gpu_memory_bytes == ((0, 7 * GIB),) and len(whole.mig_memory_bytes) == 2
    assert seen((MIG_A, 1)).gpu_memory_bytes == ((0, 3 * GIB), (1, 5 * GIB))


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


def test_workers_of_an_ended_instance_are_its_orphans_until_they_let_go():
    w = world()
    note_instance(w, TargetReadings(process=PROC))  # main 10, worker 11
    assert w.pids == {10, 11} and not w.previous_pids
    note_instance(w, TargetReadings(process=None))  # the engine is gone; its worker is not
    assert w.previous_pids == {10, 11} and not w.pids
    gpu = GpuReading(gpus=(), processes=(GpuProcess(0, 11, 70 * GIB), GpuProcess(1, 77, GIB)))
    joined = attribute_gpu_memory(gpu, {}, {"vllm": w.previous_pids})
    assert joined.orphaned == {"vllm": {0: 70 * GIB}}
    assert joined.foreign == {1: GIB}  # only what no instance of ours left
    forget_departed(w, "vllm", joined)
    assert w.previous_pids == {10, 11}
    freed = attribute_gpu_memory(GpuReading(gpus=()), {}, {"vllm": w.previous_pids})
    forget_departed(w, "vllm", freed)
    assert not w.previous_pids  # a pid handed out again later is never taken for an orphan


def test_a_replaced_or_exited_instance_leaves_its_last_live_tree_behind():
    w = world()
    w.state = replace(w.state, pid=10, create_time=100.0)
    note_instance(w, TargetReadings(process=PROC))
    zombie = replace(PROC, zombie=True)
    note_instance(w, TargetReadings(process=zombie))  # exited, not reaped yet
    assert w.previous_pids == {10, 11} and not w.pids
    w2 = world()
    w2.state = replace(w2.state, pid=10, create_time=100.0)
    note_instance(w2, TargetReadings(process=PROC))
    note_instance(w2, TargetReadings(process=ProcessSample(20, 500.0, (20,), 1, 0.0, 0)))
    assert w2.previous_pids == {10, 11} and w2.pids == {20}
    failed = TargetReadings(process=None, process_error="permission_denied")
    note_instance(w2, failed)  # the source failing says nothing about the instance
    assert w2.pids == {20}


def test_gpu_errors_concern_only_the_gpus_a_target_uses_and_are_seen_once():
    lost = GpuSample(2, "GPU-2", "H200", False, error="gpu_lost")
    gpu = GpuReading(
        gpus=(
            GpuSample(0, "GPU-0", "H200", True, xids=(79, 13)),
            GpuSample(1, "GPU-1", "H200", True, xids=(48,), ecc_uncorrected_new=2),
            lost,
        ),
        processes=(GpuProcess(0, 10, 3 * GIB),),
    )
    attribution = attribute_gpu_memory(gpu, {"vllm": PROC.pids})
    readings = TargetReadings(process=PROC)

    held = observe("vllm", world(), readings, host_readings({}), gpu, attribution, gpus=None, now=1)
    named = observe(
        "vllm", world(), readings, host_readings({}), gpu, attribution, gpus={1, 2}, now=1
    )
    stale = replace(gpu, stale=True)
    again = observe(
        "vllm", world(), readings, host_readings({}), stale, attribution, gpus=None, now=2
    )

    # on the GPU it holds memory on: the critical Xid 79 only (13 is an application's fault)
    assert held.observation.gpu_errors == ("Xid 79 on GPU 0 (GPU has fallen off the bus)",)
    assert named.observation.gpu_errors == (
        "Xid 48 on GPU 1 (Double-bit ECC error)",
        "2 uncorrectable ECC error(s) on GPU 1",
        "GPU 2 is lost (NVML_ERROR_GPU_IS_LOST)",
    )
    assert again.observation.gpu_errors == ()  # a stale reading's events were seen already


ACCESS = 'INFO:     127.0.0.1:{} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
THROUGHPUT = "INFO 05-12 02:45:{:02} [metrics.py:455] Avg prompt throughput: {}.0 tokens/s"


def tick_of(lines: list[str], at: float) -> TargetReadings:
    return TargetReadings(process=PROC, logs=LogReading(tuple(RawLogLine(t, at) for t in lines)))


def run_ticks(w: TargetWorld, ticks: list[list[str]], start: float = 200.0):
    gpu = GpuReading(gpus=())
    none = attribute_gpu_memory(gpu, {})
    for i, lines in enumerate(ticks):
        now = start + i
        obs = observe(
            "vllm", w, tick_of(lines, now), host_readings({}), gpu, none, gpus=None, now=now
        )
        w.state = step(w.state, obs.observation, now, Thresholds())
    return w.state


def test_every_line_read_is_counted_by_class_however_many_a_tick_brings():
    # Issue 30 #11: 30,500 of 300,000 lines were counted once the source screened a flood.
    tick = [ACCESS.format(40_000 + i % 9000) for i in range(15_000)]
    tick += [THROUGHPUT.format(i % 60, i) for i in range(4_950)]
    tick += [f"WARNING 05-12 02:45:10 [scheduler.py:1] preempted request {i}" for i in range(50)]
    state = run_ticks(world(), [tick, tick, tick])
    counts = dict(state.counters.log_lines)
    assert sum(counts.values()) == 60_000
    assert counts[LogClass.BENIGN] == 45_000  # request traffic, known and never notable
    assert counts[LogClass.WARNING] == 150


def test_request_access_lines_are_traffic_never_start_up_progress():
    w = world()
    w.state = replace(w.state, pid=PROC.pid, create_time=PROC.create_time)
    requests = [ACCESS.format(40_000 + i) for i in range(100)]
    state = run_ticks(w, [requests, requests])
    assert state.phase is Phase.STARTING
    assert "logs" not in (state.last_evidence or "")
    # the same tick of start-up chatter is evidence
    state = run_ticks(w, [[THROUGHPUT.format(i % 60, i) for i in range(100)]], start=300.0)
    assert "logs" in (state.last_evidence or "")
