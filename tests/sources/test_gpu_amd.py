"""AMD GPU source tests: the real ``amdsmi`` binding (PyPI) against a simulated libamd_smi.so.

Why amd-smi is faked: CI and this machine have no AMD GPU or ROCm. Faking the C library, not
the binding, keeps the real amdsmi code path under test (its ctypes struct layouts, its
socket-then-processor enumeration, its status codes); the fake's stubs are generated from the
installed binding, so a binding that needs a new symbol fails the build here, not in the field.
A real AMD host is checked by ``tests/gpu/check_real_gpu.sh --vendor amd``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.base.errors import ConfigErrors, SourceAbsent, SourceError
from exporter.base.model import GpuProcess, GpuReading, GpuSample, MigSample
from exporter.config import Settings, load_settings
from exporter.core.observe import attribute_gpu_memory
from exporter.sources.gpu.amd.source import AmdGpuSource, amdsmi_library_present
from exporter.sources.gpu.source import GpuSource
from exporter.sources.gpu.vendors import OptionalVendor, merge_readings, vendor_sources
from exporter_tooling.fakeamdsmi import STATE_ENV, build_simulated_amdsmi, ecc_line
from exporter_tooling.fakenvml import gpu_line, proc_line, write_state
from tests.gpu import check_real_gpu
from tests.gpu.check_real_gpu import first_reading as eventually
from tests.sources.test_gpu import failure

GIB = 1 << 30
TOTAL = 192 * GIB
NAME = "AMD-Instinct-MI300X"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def amd_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The simulated library, compiled once per session with the system cc."""
    return str(build_simulated_amdsmi(tmp_path_factory.mktemp("simulated-amdsmi")).parent)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "amdsmi-state"
    monkeypatch.setenv(STATE_ENV, str(path))
    return path


@pytest.fixture
def make_source(amd_lib: str) -> Iterator[Callable[..., AmdGpuSource]]:
    sources: list[AmdGpuSource] = []

    def make(**options: object) -> AmdGpuSource:
        options.setdefault("library_dir", amd_lib)
        options.setdefault("backoff_initial", 0.05)
        source = AmdGpuSource(**options)  # type: ignore[arg-type]
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()


def amd_gpu(index: int, used: int = GIB, gfx: int = 30, umc: int = 10) -> str:
    return gpu_line(index, f"amd-uuid-{index:04d}", NAME, TOTAL, used, gfx, umc)


@pytest.mark.integration
def test_vram_activity_and_ecc_of_each_gpu_come_through_the_real_binding(make_source, state):
    write_state(
        state,
        [amd_gpu(0, used=40 * GIB, gfx=87, umc=12), amd_gpu(1, used=3 * GIB), ecc_line(0, 5, 2)],
    )

    reading = eventually(make_source())

    first, second = reading.gpus
    assert first == GpuSample(
        index=0,
        uuid="amd-uuid-0000",
        name=NAME,
        up=True,
        memory_used_bytes=40 * GIB,
        memory_total_bytes=TOTAL,
        utilization_ratio=0.87,
        memory_utilization_ratio=0.12,
        vendor="amd",
        ecc_uncorrected_volatile=2,
    )
    # GPU 1 reports no RAS counts: absent, never a fake 0.
    assert (second.memory_used_bytes, second.ecc_uncorrected_volatile) == (3 * GIB, None)


@pytest.mark.integration
def test_vram_climbing_between_samples_is_seen(make_source, state):
    write_state(state, [amd_gpu(0, used=GIB)])
    source = make_source()
    eventually(source)

    write_state(state, [amd_gpu(0, used=70 * GIB)])

    assert source.sample().gpus[0].memory_used_bytes == 70 * GIB


@pytest.mark.integration
def test_per_process_vram_is_attributed_to_the_real_process_holding_it(make_source, state, sleeper):
    worker, stray = sleeper(), sleeper()
    write_state(
        state,
        [
            amd_gpu(0),
            amd_gpu(1),
            proc_line(0, worker, 30 * GIB),
            proc_line(1, worker, 31 * GIB),
            proc_line(1, stray, 4 * GIB),
        ],
    )

    reading = eventually(make_source())
    attribution = attribute_gpu_memory(reading, {"vllm": [os.getpid(), worker]})

    assert GpuProcess(0, worker, 30 * GIB) in reading.processes
    assert attribution.per_target == {"vllm": {0: 30 * GIB, 1: 31 * GIB}}
    assert attribution.foreign == {1: 4 * GIB}


@pytest.mark.integration
def test_unsupported_activity_is_absent_and_the_rest_still_reads(make_source, state):
    write_state(state, [amd_gpu(0, used=9 * GIB), "error amdsmi_get_gpu_activity 2"])

    gpu = eventually(make_source()).gpus[0]

    assert (gpu.utilization_ratio, gpu.memory_utilization_ratio) == (None, None)
    assert gpu.memory_used_bytes == 9 * GIB and gpu.up


@pytest.mark.integration
def test_missing_library_says_library_not_found_with_an_amd_hint(
    make_source, state, tmp_path, caplog
):
    empty = tmp_path / "no-rocm"
    empty.mkdir()
    source = make_source(library_dir=str(empty), backoff_initial=30.0)

    absent = failure(source)
    assert isinstance(absent, SourceAbsent) and absent.reason == "library_not_found"
    assert source.child_starts == 1
    assert "amd-smi-lib" in absent.hint
    assert "amdsmi = false" in absent.hint and "amdsmi_library_dir" in absent.hint
    assert not [r for r in caplog.records if "amdsmi down" in r.message]


@pytest.mark.integration
def test_driver_not_loaded_at_init_is_classified_and_recovers(make_source, state):
    write_state(state, [amd_gpu(0), "init_error 34"])
    source = make_source()

    assert failure(source).reason == "driver_not_loaded"
    write_state(state, [amd_gpu(0, used=5 * GIB)])
    assert eventually(source).gpus[0].memory_used_bytes == 5 * GIB


@pytest.mark.integration
def test_a_segfaulting_call_restarts_the_child(make_source, state):
    write_state(state, [amd_gpu(0), "crash amdsmi_get_gpu_memory_usage"])
    source = make_source(backoff_initial=0.1)

    reasons = set()
    stop = time.monotonic() + 20.0
    while source.child_starts < 2 and time.monotonic() < stop:
        try:
            source.sample()
        except SourceError as exc:
            reasons.add(exc.reason)
        time.sleep(0.01)

    assert "crashed" in reasons and source.child_starts >= 2
    write_state(state, [amd_gpu(0, used=6 * GIB)])
    assert eventually(source).gpus[0].memory_used_bytes == 6 * GIB


@pytest.mark.integration
def test_a_hung_call_fails_within_the_deadline_and_marks_the_reading_stale(make_source, state):
    write_state(state, [amd_gpu(0)])
    source = make_source()
    eventually(source)

    write_state(state, [amd_gpu(0), "hang amdsmi_get_gpu_process_list 60"])

    with pytest.raises(SourceError) as raised:
        source.sample()
    assert raised.value.reason == "timeout"
    assert source.last_reading is not None and source.last_reading.stale


@pytest.mark.integration
def test_an_absent_vendor_library_reads_as_no_gpus_when_both_vendors_run(tmp_path, state):
    # An AMD host with the default config: NVML finds no libnvidia-ml.so.1. That is "no
    # NVIDIA GPUs here", not a source down for ever.
    empty = tmp_path / "no-driver"
    empty.mkdir()
    nvidia = OptionalVendor(GpuSource(library_dir=str(empty), backoff_initial=30.0))
    with nvidia.source:
        assert eventually(nvidia) == GpuReading(gpus=())  # type: ignore[arg-type]


def test_vendors_start_only_where_their_library_is(amd_lib, tmp_path):
    empty = str(tmp_path)
    assert amdsmi_library_present(amd_lib) and not amdsmi_library_present(empty)

    nvidia_only = vendor_sources(Settings(amdsmi_library_dir=empty), None)
    amd_only = vendor_sources(Settings(nvml=False, amdsmi_library_dir=amd_lib), None)
    both = vendor_sources(Settings(amdsmi_library_dir=amd_lib), None)

    assert [type(s) for s in nvidia_only] == [GpuSource]  # today's NVML source, unchanged
    assert [s.name for s in amd_only] == ["amdsmi"]
    assert [s.name for s in both] == ["nvml", "amdsmi"]
    for source in both + amd_only + nvidia_only:
        source.close()


def test_amd_gpus_are_numbered_after_the_nvidia_ones_with_their_processes():
    nvidia = GpuReading(
        (GpuSample(0, "GPU-a", "H100", True), GpuSample(1, "GPU-b", "H100", True)),
        (GpuProcess(1, 10, GIB),),
        migs=(MigSample(1, "MIG-x", 1, 0),),
    )
    amd = GpuReading(
        (GpuSample(0, "amd-0", NAME, True, vendor="amd"),), (GpuProcess(0, 20, 2 * GIB),)
    )

    merged = merge_readings([nvidia, amd])

    assert [(g.index, g.uuid, g.vendor) for g in merged.gpus] == [
        (0, "GPU-a", "nvidia"),
        (1, "GPU-b", "nvidia"),
        (2, "amd-0", "amd"),
    ]
    assert merged.processes == (GpuProcess(1, 10, GIB), GpuProcess(2, 20, 2 * GIB))
    assert merged.migs == nvidia.migs  # MIG is NVIDIA's, and NVIDIA comes first
    assert merge_readings([GpuReading(()), amd]).gpus[0].index == 0
    assert merge_readings([replace_stale(nvidia), amd]).stale


def replace_stale(reading: GpuReading) -> GpuReading:
    return GpuReading(reading.gpus, reading.processes, stale=True)


@pytest.mark.integration
def test_real_gpu_check_passes_on_both_simulated_vendors(monkeypatch, capsys):
    # Keeps check_real_gpu.sh's AMD path from rotting on hosts without an AMD GPU; the real
    # run (a child's hipMalloc seen through the real amd-smi) needs an AMD host.
    for name in (STATE_ENV, "SIMULATED_NVML_STATE"):
        monkeypatch.delenv(name, raising=False)  # main() points each at its state file
    monkeypatch.setattr(sys, "argv", ["check", "--simulate", "--gpus", "2", "--samples", "5"])

    code = check_real_gpu.main()

    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    assert any(line.startswith("amd gpu 1 Simulated-GPU used=1702887424 ") for line in lines)
    verdicts = [line.split(":", 1)[0] for line in lines if ": PASS: 1024 MiB allocated" in line]
    assert verdicts == ["nvidia", "amd"]


def test_config_turns_amd_off_or_points_at_a_library_and_refuses_a_bad_value(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[exporter]\namdsmi = false\namdsmi_library_dir = "/opt/rocm/lib"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[exporter]\namdsmi = "yes"\n')

    settings = load_settings(good)

    assert (settings.amdsmi, settings.amdsmi_library_dir) == (False, "/opt/rocm/lib")
    with pytest.raises(ConfigErrors, match="amdsmi"):
        load_settings(bad)
