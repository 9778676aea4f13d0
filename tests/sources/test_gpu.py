"""GPU source tests: the real pynvml binding against a simulated libnvidia-ml.so.1.

Why NVML is faked: CI and this machine have no NVIDIA GPU or driver. Faking the C library, not
the binding, keeps the real pynvml code path (ctypes layouts, two-call process listing, error
classes) under test; each fault below is one written in the field (RELIABILITY.md cases C33-42).
A real GPU host is checked by tests/gpu/check_real_gpu.sh.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import GpuProcess, GpuReading, GpuSample, MigSample
from exporter.config import Settings, Target
from exporter.core.observe import attribute_gpu_memory
from exporter.daemon import Daemon
from exporter.history import History
from exporter.render.status import render_status
from exporter.sources.gpu.source import GpuSource
from exporter_tooling.fakenvml import (
    STATE_ENV,
    build_simulated_nvml,
    health_lines,
    mig_line,
    mig_mode_line,
    mig_proc_line,
    write_state,
    xid_line,
)
from tests.gpu.check_real_gpu import first_reading as eventually

GIB = 1 << 30
TOTAL = 80 * GIB
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def nvml_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every variant of the simulated library, compiled once per session with the system cc."""
    root = tmp_path_factory.mktemp("simulated-nvml")
    return {
        variant: str(build_simulated_nvml(root / variant, variant=variant).parent)
        for variant in ("default", "no_v3", "no_v3_v2", "no_mig", "no_events")
    }


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml-state"
    monkeypatch.setenv(STATE_ENV, str(path))
    return path


@pytest.fixture
def make_source(nvml_libs: dict[str, str]) -> Iterator[Callable[..., GpuSource]]:
    sources: list[GpuSource] = []

    def make(variant: str = "default", **options: object) -> GpuSource:
        options.setdefault("library_dir", nvml_libs[variant])
        options.setdefault("backoff_initial", 0.05)
        source = GpuSource(**options)  # type: ignore[arg-type]
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()


def gpu_line(index: int, used: int = GIB, util: int = 30, mem_util: int = 10) -> str:
    return f"gpu {index} GPU-{index:08d}-sim NVIDIA-H100-80GB-HBM3 {TOTAL} {used} {util} {mem_util}"


def failure(source: GpuSource, *, within: float = 20.0) -> SourceError:
    """Sample until the source reports a failure other than "the child is still starting"."""
    stop = time.monotonic() + within
    while time.monotonic() < stop:
        try:
            source.sample()
        except SourceError as exc:
            if exc.reason != "starting":
                return exc
        time.sleep(0.02)
    raise AssertionError("the source never failed")


def unused_pid() -> int:
    """A pid no process in our namespace has: stands for a process in another namespace."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


@pytest.mark.integration
def test_no_state_file_is_a_host_with_zero_gpus(make_source, state):
    reading = eventually(make_source())

    assert reading == GpuReading(gpus=(), processes=())


@pytest.mark.integration
def test_child_env_points_the_child_at_a_state_file(make_source, tmp_path, monkeypatch):
    # The demo hands the simulator's state file to the child without touching our environment.
    monkeypatch.delenv(STATE_ENV, raising=False)
    write_state(tmp_path / "demo-gpus", [gpu_line(0), gpu_line(1)])

    reading = eventually(make_source(child_env={STATE_ENV: str(tmp_path / "demo-gpus")}))

    assert [gpu.index for gpu in reading.gpus] == [0, 1]


@pytest.mark.integration
def test_eight_gpus_report_every_field(make_source, state):
    write_state(
        state,
        [gpu_line(i, used=(i + 1) * GIB, util=10 * i, mem_util=i) for i in range(8)]
        + [f"proc {i} {4000 + i} {(i + 1) * GIB}" for i in range(8)]
        + ["reserved 3 536870912", "pcie 5 250000"],
    )

    reading = eventually(make_source())

    assert [gpu.index for gpu in reading.gpus] == list(range(8))
    assert all(gpu.up and gpu.memory_total_bytes == TOTAL for gpu in reading.gpus)
    assert reading.gpus[7] == GpuSample(
        index=7,
        uuid="GPU-00000007-sim",
        name="NVIDIA-H100-80GB-HBM3",
        up=True,
        memory_used_bytes=8 * GIB,
        memory_total_bytes=TOTAL,
        memory_reserved_bytes=0,
        utilization_ratio=0.7,
        memory_utilization_ratio=0.07,
        pcie_rx_bytes_per_second=0.0,
        # the simulated GPU is healthy: no errors, no throttling, a Gen5 x16 link
        ecc_uncorrected_volatile=0,
        retired_pages_pending=False,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failed=False,
        throttle_reasons=0,
        pcie_link_generation=5,
        pcie_link_generation_max=5,
        pcie_link_width=16,
        pcie_link_width_max=16,
    )
    assert reading.gpus[3].memory_reserved_bytes == 512 << 20
    assert reading.gpus[5].pcie_rx_bytes_per_second == 250000 * 1024  # NVML says KB/s
    assert reading.processes == tuple(GpuProcess(i, 4000 + i, (i + 1) * GIB) for i in range(8))
    assert not reading.stale


@pytest.mark.integration
def test_memory_climbing_between_samples_is_seen(make_source, state):
    source = make_source()
    seen = []
    for used in (0, 20 * GIB, 55 * GIB, 76 * GIB):
        write_state(state, [gpu_line(0, used=used), f"proc 0 4242 {used}"])
        reading = eventually(source)
        seen.append((reading.gpus[0].memory_used_bytes, reading.processes[0].used_memory_bytes))

    assert seen == [(0, 0), (20 * GIB, 20 * GIB), (55 * GIB, 55 * GIB), (76 * GIB, 76 * GIB)]
    assert source.child_starts == 1


@pytest.mark.integration
def test_a_gpu_lost_mid_run_is_down_while_the_others_keep_updating(make_source, state):
    source = make_source()
    write_state(state, [gpu_line(i, used=GIB) for i in range(3)] + ["proc 1 4242 1073741824"])
    eventually(source)

    write_state(state, [gpu_line(i, used=2 * GIB) for i in range(3)] + ["lost 1"])
    reading = source.sample()

    lost = reading.gpus[1]
    assert (lost.up, lost.error, lost.uuid, lost.memory_used_bytes) == (
        False,
        "gpu_lost",
        "GPU-00000001-sim",
        None,
    )
    assert [gpu.memory_used_bytes for gpu in reading.gpus if gpu.up] == [2 * GIB, 2 * GIB]
    assert reading.processes == ()

    write_state(state, [gpu_line(i, used=3 * GIB) for i in range(3)])
    assert all(gpu.up for gpu in source.sample().gpus)


@pytest.mark.integration
def test_a_gpu_whose_handle_is_refused_is_down_with_a_reason(make_source, state):
    # Seen when a container's cgroup hides some GPUs that NVML still counts.
    write_state(
        state,
        [gpu_line(0), gpu_line(1), gpu_line(2), "error nvmlDeviceGetHandleByIndex_v2 4 1"]
        + ["error nvmlDeviceGetUUID 999 2"],
    )

    reading = eventually(make_source())

    assert [(gpu.up, gpu.error) for gpu in reading.gpus] == [
        (True, None),
        (False, "no_permission"),
        (False, "nvml_error"),
    ]


@pytest.mark.integration
def test_missing_library_is_absent_not_down_without_a_crash_loop(
    make_source, state, tmp_path, caplog
):
    empty = tmp_path / "no-driver"
    empty.mkdir()
    source = make_source(library_dir=str(empty), backoff_initial=30.0)

    errors = [failure(source)]
    for _ in range(20):
        with pytest.raises(SourceError) as raised:
            source.sample()
        errors.append(raised.value)

    assert {e.reason for e in errors} == {"library_not_found"}
    assert all(isinstance(e, SourceAbsent) for e in errors), "a host without NVIDIA is not down"
    assert source.child_starts == 1
    # The hint names the real keys: the one that turns NVML off and the library's directory.
    hint = errors[0].hint
    assert "nvml = false" in hint and "nvml_library_dir" in hint
    assert "install the NVIDIA driver" in hint
    assert not [r for r in caplog.records if "nvml down" in r.message]


@pytest.mark.integration
def test_version_mismatch_at_init_recovers_without_a_restart(make_source, state, caplog):
    caplog.set_level(logging.INFO, logger="exporter.sources.gpu.source")
    write_state(state, ["init_error 18", gpu_line(0)])
    source = make_source()

    assert failure(source).reason == "version_mismatch"
    while source.child_starts < 2:  # retried by a fresh child after the backoff: still down
        failure(source)
    assert failure(source).reason == "version_mismatch"
    write_state(state, [gpu_line(0)])
    reading = eventually(source)

    assert [gpu.uuid for gpu in reading.gpus] == ["GPU-00000000-sim"]
    assert source.child_starts >= 3
    hints = [r.message for r in caplog.records if "reason=version_mismatch" in r.message]
    assert len(hints) == 1 and "reboot" in hints[0]
    assert any("nvml up" in r.message and "version_mismatch" in r.message for r in caplog.records)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("variant", "api"), [("default", "v3"), ("no_v3", "v2"), ("no_v3_v2", "v1")]
)
def test_process_listing_falls_back_when_a_versioned_symbol_is_missing(
    make_source, state, caplog, variant, api
):
    caplog.set_level(logging.INFO, logger="exporter.sources.gpu.source")
    write_state(state, [gpu_line(0), gpu_line(1), "proc 0 4242 1000", "proc 1 4343 2000"])
    source = make_source(variant)

    readings = [eventually(source) for _ in range(3)]

    assert all(
        r.processes == (GpuProcess(0, 4242, 1000), GpuProcess(1, 4343, 2000)) for r in readings
    )
    chosen = [r.message for r in caplog.records if "process listing" in r.message]
    assert chosen == [f"nvml process listing api={api}"]


@pytest.mark.integration
def test_not_supported_fields_are_absent_not_zero(make_source, state):
    write_state(
        state,
        [
            gpu_line(0),
            gpu_line(1),
            "not_supported nvmlDeviceGetUtilizationRates",
            "not_supported nvmlDeviceGetPcieThroughput 1",
            "not_supported nvmlDeviceGetMemoryInfo_v2",
        ],
    )

    gpu0, gpu1 = eventually(make_source()).gpus

    assert (gpu0.utilization_ratio, gpu0.memory_utilization_ratio) == (None, None)
    assert (gpu0.pcie_rx_bytes_per_second, gpu1.pcie_rx_bytes_per_second) == (0.0, None)
    # v2 memory info unsupported: v1 still gives used and total, but no reserved figure.
    assert (gpu1.memory_used_bytes, gpu1.memory_total_bytes, gpu1.memory_reserved_bytes) == (
        GIB,
        TOTAL,
        None,
    )
    assert gpu0.up and gpu1.up


@pytest.mark.integration
def test_a_call_blocked_for_60s_fails_within_the_deadline_then_recovers(make_source, state):
    write_state(state, [gpu_line(0)])
    source = make_source()
    eventually(source)

    write_state(state, [gpu_line(0, used=7 * GIB), "hang nvmlDeviceGetUtilizationRates 60"])
    started = time.monotonic()
    with pytest.raises(SourceError) as raised:
        source.sample()
    waited = time.monotonic() - started

    assert raised.value.reason == "timeout"
    assert waited < 3.0  # generous bound: the deadline is 0.5 s, the hang 60 s
    assert source.last_reading is not None and source.last_reading.stale
    write_state(state, [gpu_line(0, used=9 * GIB)])
    assert eventually(source).gpus[0].memory_used_bytes == 9 * GIB
    assert source.child_starts == 2


@pytest.mark.integration
def test_a_segfaulting_call_restarts_the_child_with_backoff(make_source, state, caplog):
    write_state(state, [gpu_line(0), "crash nvmlDeviceGetHandleByIndex_v2"])
    source = make_source(backoff_initial=0.2)

    reasons = []
    stop = time.monotonic() + 20.0
    while source.child_starts < 3 and time.monotonic() < stop:
        try:
            source.sample()
        except SourceError as exc:
            reasons.append(exc.reason)
        time.sleep(0.01)

    assert source.child_starts == 3 and "crashed" in reasons
    # Between restarts (0.2 s, then 0.4 s of backoff) samples fail fast without a new child;
    # a crash loop would start one child per sample.
    assert len(reasons) > 10 * source.child_starts
    assert len([r for r in caplog.records if "reason=crashed" in r.message]) == 1
    write_state(state, [gpu_line(0)])
    assert eventually(source).gpus[0].up


@pytest.mark.integration
def test_records_written_with_a_32_byte_stride_are_rejected_and_counted(make_source, state, caplog):
    write_state(state, [gpu_line(0), "proc 0 4242 1000", "proc 0 4343 2000", "proc 0 4444 3000"])
    source = make_source()
    assert len(eventually(source).processes) == 3

    write_state(
        state,
        [gpu_line(0), "proc 0 4242 1000", "proc 0 4343 2000", "proc 0 4444 3000", "stride32"],
    )
    reading = source.sample()

    # The binding reads 24-byte records: the 2nd and 3rd land on padding and instance ids,
    # giving pids 0 and 0xFFFFFFFF, which no kernel hands out.
    assert reading.processes == (GpuProcess(0, 4242, 1000),)
    assert source.rejected_process_records == 2
    source.sample()
    assert source.rejected_process_records == 4
    assert len([r for r in caplog.records if "records rejected" in r.message]) == 1


@pytest.mark.integration
def test_out_of_range_values_read_as_unknown_and_are_logged_once(make_source, state, caplog):
    # Issue 30 #15: 1.8e19 B used of 80 GiB and a ratio of 4.3e7 were exported as they came.
    impossible = gpu_line(1, used=18 * 10**18, util=4294967295, mem_util=101)
    write_state(state, [gpu_line(0), impossible, "pcie 1 18000000000000000"])
    source = make_source()
    sane, bad = eventually(source).gpus
    assert sane.memory_used_bytes == GIB and sane.utilization_ratio == 0.3
    assert (bad.memory_used_bytes, bad.utilization_ratio, bad.memory_utilization_ratio) == (
        None,
        None,
        None,
    )
    assert bad.memory_total_bytes == TOTAL and bad.up, "the GPU and its plausible values stay"
    assert bad.pcie_rx_bytes_per_second is None
    source.sample()
    assert source.rejected_values == 8  # four fields, two samples
    logged = [r.message for r in caplog.records if "out of range" in r.message]
    assert len(logged) == 4 and all("uuid=GPU-00000001-sim" in line for line in logged)


@pytest.mark.integration
def test_memory_is_attributed_to_targets_foreign_and_unattributed(
    make_source, state, sleeper, caplog
):
    worker_a, worker_b, stray = sleeper(), sleeper(), sleeper()
    hidden = unused_pid()
    write_state(
        state,
        [
            gpu_line(0),
            gpu_line(1),
            f"proc 0 {worker_a} {30 * GIB}",
            f"proc 1 {worker_b} {31 * GIB}",
            f"proc 0 {stray} {5 * GIB}",
            f"proc 1 {hidden} {2 * GIB}",
        ],
    )
    source = make_source()

    reading = eventually(source)
    eventually(source)
    attribution = attribute_gpu_memory(
        reading,
        {"sglang": [os.getpid(), worker_a, worker_b], "idle": [1_000_000]},
    )

    assert attribution.per_target == {"sglang": {0: 30 * GIB, 1: 31 * GIB}, "idle": {}}
    assert attribution.foreign == {0: 5 * GIB}
    assert (attribution.unattributed_pids, attribution.unattributed) == (1, {1: 2 * GIB})
    outside = [r for r in caplog.records if "outside our pid namespace" in r.message]
    assert len(outside) == 1


@pytest.mark.integration
def test_binding_path_and_both_wheels_are_logged_once(
    make_source, state, tmp_path, caplog, monkeypatch
):
    # A second wheel claiming the module, as when gpustat's old "pynvml" sits beside nvidia-ml-py.
    site = tmp_path / "site"
    (site / "pynvml-11.5.0.dist-info").mkdir(parents=True)
    (site / "pynvml-11.5.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pynvml\nVersion: 11.5.0\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    caplog.set_level(logging.INFO, logger="exporter.sources.gpu.source")
    write_state(state, [gpu_line(0), "init_error 9"])
    source = make_source()

    assert failure(source).reason == "driver_not_loaded"
    write_state(state, [gpu_line(0)])
    eventually(source)
    write_state(state, [gpu_line(0), "crash nvmlDeviceGetCount_v2"])
    assert failure(source).reason == "crashed"
    write_state(state, [gpu_line(0)])
    eventually(source)

    binding = [r.message for r in caplog.records if "nvml binding" in r.message]
    assert len(binding) == 1 and "pynvml.py" in binding[0] and "pynvml==11.5.0" in binding[0]
    assert len([r for r in caplog.records if "both the pynvml and nvidia-ml-py" in r.message]) == 1


def test_attribution_sums_per_gpu_and_skips_unknown_memory():
    reading = GpuReading(
        gpus=(),
        processes=(
            GpuProcess(0, 10, 100),
            GpuProcess(0, 11, 50),
            GpuProcess(1, 11, 70),
            GpuProcess(1, 12, None),
            GpuProcess(1, 20, 5),
            GpuProcess(2, 30, 9, visible=False),
            GpuProcess(3, 30, 1, visible=False),
        ),
    )

    attribution = attribute_gpu_memory(reading, {"a": {10, 11}, "b": [12]})

    assert attribution.per_target == {"a": {0: 150, 1: 70}, "b": {}}
    assert attribution.foreign == {1: 5}
    assert (attribution.unattributed_pids, attribution.unattributed) == (1, {2: 9, 3: 1})


def test_attribution_counts_every_visible_stranger_as_foreign():
    reading = GpuReading(gpus=(), processes=(GpuProcess(0, 10, 100), GpuProcess(0, 99, 7)))

    attribution = attribute_gpu_memory(reading, {"a": [10]})

    assert (attribution.foreign, attribution.unattributed_pids) == ({0: 7}, 0)


def test_simulated_library_build_is_cached_by_source_hash(tmp_path):
    first = build_simulated_nvml(tmp_path)
    built_at = first.stat().st_mtime_ns

    again = build_simulated_nvml(tmp_path)

    assert again == first and again.stat().st_mtime_ns == built_at
    with pytest.raises(ValueError, match="unknown simulated NVML variant 'nope'"):
        build_simulated_nvml(tmp_path, variant="nope")


@pytest.mark.integration
def test_real_gpu_check_script_passes_on_the_simulated_library():
    # Keeps tests/gpu/check_real_gpu.sh from rotting on hosts without a GPU; the real run
    # (a child's cudaMalloc seen through the real NVML) needs an NVIDIA host.
    script = Path(__file__).resolve().parents[1] / "gpu" / "check_real_gpu.sh"

    result = subprocess.run(
        [str(script), "--simulate", "--gpus", "2", "--samples", "5"],
        # The script's own default is the checkout's .venv; a worktree or another venv has
        # none, and the system python3 lacks the bindings (binding_missing).
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("PASS: 1024 MiB allocated by pid ")


MIG_A = "MIG-4b4c9a1e-6b0b-5e33-9c1f-3a5f0e2d7c11"
MIG_B = "MIG-8f2d6c3a-1e4b-5a77-b0c2-9d6e4f1a2b33"
SLICE = 40 * GIB


def two_slices(pid_a: int, pid_b: int) -> list[str]:
    """GPU 0 in MIG mode, two 3g.40gb slices with a process each; GPU 1 not MIG-capable."""
    return [
        gpu_line(0, used=31 * GIB),
        gpu_line(1),
        mig_mode_line(0, True),
        mig_line(0, MIG_A, 1, 0, SLICE, 20 * GIB, "3g.40gb"),
        mig_line(0, MIG_B, 2, 0, SLICE, 11 * GIB, "3g.40gb"),
        mig_proc_line(MIG_A, pid_a, 20 * GIB),
        mig_proc_line(MIG_B, pid_b, 11 * GIB),
        f"proc 1 {pid_b} {GIB}",
    ]


@pytest.mark.integration
def test_mig_slices_their_memory_and_processes_are_read_through_the_binding(make_source, state):
    write_state(state, two_slices(4242, 4343))

    reading = eventually(make_source())

    assert reading.migs == (
        MigSample(0, MIG_A, 1, 0, "3g.40gb", 20 * GIB, SLICE),
        MigSample(0, MIG_B, 2, 0, "3g.40gb", 11 * GIB, SLICE),
    )
    # each process once, on its slice: the whole GPU's aggregate listing is not counted again
    assert sorted(reading.processes, key=lambda p: p.pid) == [
        GpuProcess(0, 4242, 20 * GIB, mig_uuid=MIG_A),
        GpuProcess(1, 4343, GIB),
        GpuProcess(0, 4343, 11 * GIB, mig_uuid=MIG_B),
    ]
    gpu0, gpu1 = reading.gpus
    assert (gpu0.mig_enabled, gpu0.mig_pending) == (True, True)
    assert (gpu0.memory_used_bytes, gpu0.memory_total_bytes) == (31 * GIB, TOTAL)
    assert gpu1.mig_enabled is None  # NOT_SUPPORTED: a GPU that cannot do MIG


@pytest.mark.integration
def test_a_mig_capable_gpu_with_mig_off_or_pending_lists_no_slices(make_source, state):
    write_state(
        state,
        [gpu_line(0), mig_mode_line(0, False, pending=True), "proc 0 4242 1000"],
    )

    reading = eventually(make_source())

    assert (reading.gpus[0].mig_enabled, reading.gpus[0].mig_pending) == (False, True)
    assert reading.migs == ()
    assert reading.processes == (GpuProcess(0, 4242, 1000),)


@pytest.mark.integration
def test_a_driver_without_the_mig_calls_reads_every_gpu_as_before(make_source, state):
    """An R418-era driver: no nvmlDeviceGetMigMode symbol at all (the binding says
    FUNCTION_NOT_FOUND); the whole GPU's own listing is all there is, and nothing fails."""
    write_state(state, two_slices(4242, 4343))
    source = make_source("no_mig")

    readings = [eventually(source) for _ in range(2)]

    assert all(r.migs == () for r in readings)
    assert all(gpu.up and gpu.mig_enabled is None for gpu in readings[-1].gpus)
    assert sorted(readings[-1].processes, key=lambda p: (p.gpu_index, p.pid)) == [
        GpuProcess(0, 4242, 20 * GIB),
        GpuProcess(0, 4343, 11 * GIB),
        GpuProcess(1, 4343, GIB),
    ]
    assert source.child_starts == 1  # FUNCTION_NOT_FOUND never took the child down


@pytest.mark.integration
def test_a_mig_fake_with_two_slices_attributes_two_targets_to_their_own_slices(
    nvml_libs, state, sleeper, tmp_path
):
    """Two servers, each a real process, on two MIG slices of one GPU, through the daemon:
    each is attributed its own slice's memory; a ``gpus = ["MIG-..."]`` limit keeps only
    that slice. NVML is the simulated library behind the real binding (no GPU here)."""
    pid_a, pid_b = sleeper(), sleeper()
    write_state(state, two_slices(pid_a, pid_b))

    def target(name: str, pid: int, gpus: tuple[int | str, ...] | None) -> Target:
        pidfile = tmp_path / f"{name}.pid"
        pidfile.write_text(f"{pid}\n")
        return Target(
            name=name,
            engine="openai",
            base_url="http://127.0.0.1:9",
            health_path="/health",
            probe_timeout_seconds=0.2,
            pidfile=str(pidfile),
            gpus=gpus,
        )

    settings = Settings(
        targets=(target("a", pid_a, None), target("b", pid_b, (MIG_B,))),
        interval_seconds=0.5,
        state_directory=str(tmp_path),
        nvml_library_dir=nvml_libs["default"],
    )
    daemon = Daemon(settings, history=History.open(None), gpu_env={STATE_ENV: str(state)})
    try:
        stop = time.monotonic() + 20
        snap = daemon.tick()
        while not all(t.mig_memory_bytes for t in snap.targets) and time.monotonic() < stop:
            time.sleep(0.05)
            snap = daemon.tick()
    finally:
        daemon.close()

    a, b = snap.targets
    assert a.mig_memory_bytes == ((MIG_A, 20 * GIB),)
    assert b.mig_memory_bytes == ((MIG_B, 11 * GIB),)
    # a's memory is its slice's, under the parent GPU; b is limited to its slice, so the
    # GiB its process also holds on GPU 1 is not b's (as `gpus = [1]` would drop GPU 0)
    assert (a.gpu_memory_bytes, b.gpu_memory_bytes) == (((0, 20 * GIB),), ((0, 11 * GIB),))
    doc = render_status(snap)
    assert [m["mig_uuid"] for m in doc["migs"]] == [MIG_A, MIG_B]
    assert doc["targets"][1]["mig_memory"] == [
        {
            "mig_uuid": MIG_B,
            "gpu": 0,
            "gpu_instance_id": 2,
            "profile": "3g.40gb",
            "used_bytes": 11 * GIB,
            "total_bytes": SLICE,
        }
    ]


@pytest.mark.integration
def test_a_lost_mig_gpu_is_down_with_no_slices_left_and_a_refused_slice_is_skipped(
    make_source, state
):
    write_state(state, [*two_slices(4242, 4343), "error nvmlDeviceGetGpuInstanceId 4 0"])
    source = make_source()

    refused = eventually(source)
    write_state(state, [*two_slices(4242, 4343), "lost 0"])
    lost = eventually(source)

    # NO_PERMISSION on slice ids: those slices are left out, never shown with made-up ids
    assert refused.migs == () and refused.gpus[0].up and refused.gpus[0].mig_enabled
    # their processes still count on the whole GPU, from its aggregate listing
    assert GpuProcess(0, 4242, 20 * GIB) in refused.processes
    assert not lost.gpus[0].up and lost.migs == ()
    assert [p.gpu_index for p in lost.processes] == [1]


# --- GPU health: Xid events, ECC, retired pages, row remaps, throttle, PCIe link -------------


@pytest.mark.integration
def test_health_readings_come_through_the_real_binding(make_source, state):
    sick = health_lines(
        1,
        ecc_uncorrected=2,
        retired_pending=True,
        remap=(3, 1, 1, 0),
        throttle=0x80 | 0x4,  # power brake and software power cap
        pcie_link=(4, 5, 8, 16),
    )
    write_state(state, [gpu_line(0), gpu_line(1), *sick])

    healthy, gpu1 = eventually(make_source()).gpus

    assert (healthy.ecc_uncorrected_volatile, healthy.throttle_reasons) == (0, 0)
    assert (gpu1.ecc_uncorrected_volatile, gpu1.retired_pages_pending) == (2, True)
    assert (gpu1.remapped_rows_uncorrectable, gpu1.remapped_rows_pending) == (1, True)
    assert gpu1.remapped_rows_failed is False
    assert gpu1.throttle_reasons == 0x84
    assert (gpu1.pcie_link_generation, gpu1.pcie_link_generation_max) == (4, 5)
    assert (gpu1.pcie_link_width, gpu1.pcie_link_width_max) == (8, 16)
    assert gpu1.unsupported == () and gpu1.ecc_uncorrected_new == 0  # first sight: no growth


@pytest.mark.integration
def test_xid_events_are_delivered_once_and_counted_by_code(make_source, state):
    source = make_source()
    base = [gpu_line(0), gpu_line(1)]
    write_state(state, base)
    eventually(source)  # registered for events from here on

    write_state(state, [*base, xid_line(1, 79), xid_line(1, 48), xid_line(0, 999)])
    first = source.sample()
    write_state(state, [*base, xid_line(1, 79), xid_line(1, 48), xid_line(0, 999), xid_line(1, 79)])
    second = source.sample()
    third = source.sample()

    assert [g.xids for g in first.gpus] == [(999,), (79, 48)]
    assert [g.xids for g in second.gpus] == [(), (79,)]
    assert [g.xids for g in third.gpus] == [(), ()]  # each event once
    assert third.gpus[0].xid_counts == ((999, 1),)  # raw codes: the core labels them
    assert third.gpus[1].xid_counts == ((48, 1), (79, 2))


@pytest.mark.integration
def test_uncorrectable_ecc_growth_is_reported_once(make_source, state):
    source = make_source()
    write_state(state, [gpu_line(0), *health_lines(0, ecc_uncorrected=1)])
    eventually(source)

    write_state(state, [gpu_line(0), *health_lines(0, ecc_uncorrected=4)])
    grown = source.sample().gpus[0]
    steady = source.sample().gpus[0]

    assert (grown.ecc_uncorrected_volatile, grown.ecc_uncorrected_new) == (4, 3)
    assert (steady.ecc_uncorrected_volatile, steady.ecc_uncorrected_new) == (4, 0)


@pytest.mark.integration
def test_without_the_event_api_everything_else_works_and_the_source_says_so(
    make_source, state, caplog
):
    # An older driver: libnvidia-ml.so.1 has no nvmlEventSetCreate, so the binding raises
    # FUNCTION_NOT_FOUND; the Xid counter is absent and the rest is read as usual.
    caplog.set_level(logging.WARNING, "exporter.sources.gpu.source")
    source = make_source("no_events")
    write_state(state, [gpu_line(0, used=3 * GIB), "proc 0 4242 3221225472", xid_line(0, 79)])

    eventually(source)
    reading = source.sample()

    gpu = reading.gpus[0]
    assert gpu.up and gpu.memory_used_bytes == 3 * GIB and gpu.pcie_link_width == 16
    assert reading.processes == (GpuProcess(0, 4242, 3 * GIB),)
    assert gpu.unsupported == ("xid_events",) and gpu.xids == ()
    said = [r.getMessage() for r in caplog.records if "unsupported" in r.getMessage()]
    assert len(said) == 1 and "reading=xid_events" in said[0]


@pytest.mark.integration
def test_an_unsupported_health_call_leaves_only_its_reading_out(make_source, state):
    write_state(
        state,
        [gpu_line(0), gpu_line(1), "not_supported nvmlDeviceGetRemappedRows 0"]
        + ["error nvmlDeviceGetCurrentClocksEventReasons 13"],  # FUNCTION_NOT_FOUND: older name
    )

    gpu0, gpu1 = eventually(make_source()).gpus

    assert (gpu0.remapped_rows_pending, gpu0.remapped_rows_failed) == (None, None)
    assert gpu0.unsupported == ("remapped_rows",)
    assert gpu1.remapped_rows_pending is False and gpu1.unsupported == ()
    # the older ...ThrottleReasons symbol answers instead of the newer ...EventReasons
    assert (gpu0.throttle_reasons, gpu1.throttle_reasons) == (0, 0)
    assert gpu0.ecc_uncorrected_volatile == 0 and gpu0.pcie_link_generation == 5


@pytest.mark.integration
def test_an_xid_from_a_gpu_that_is_then_lost_is_still_reported(make_source, state):
    source = make_source()
    write_state(state, [gpu_line(0), gpu_line(1)])
    eventually(source)

    write_state(state, [gpu_line(0), gpu_line(1), xid_line(0, 79), "lost 0"])
    gone, other = source.sample().gpus

    assert (gone.up, gone.error, gone.xids) == (False, "gpu_lost", (79,))
    assert gone.xid_counts == ((79, 1),)
    assert other.up and other.xids == () and other.pcie_link_width == 16
