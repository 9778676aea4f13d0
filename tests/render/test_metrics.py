"""Rendering a hand-built Snapshot: golden exposition, promtool, label and series budget."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import fields, replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter.base.model import (
    DiskSample,
    EngineReport,
    FailureReason,
    GpuSample,
    HostReadings,
    LogClass,
    LogEvent,
    MemoryPressure,
    MigSample,
    Observation,
    Phase,
    ProbeKind,
    ProbeOutcome,
    ProbeResult,
    ProcessSample,
    SourceStatus,
)
from exporter.core.advice import THRESHOLDS, Verdicts, verdicts
from exporter.core.bounds import Bound, Bounds, PhaseFigures, StartFigures
from exporter.core.lifecycle import (
    WAKE_BUCKETS,
    ColdStart,
    Counters,
    Thresholds,
    initial_state,
    step,
)
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.render.metrics import SnapshotCollector

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures/metrics"
T0 = 1_700_000_000.0
GiB = 2**30


def loading_state():
    """A target 40 s into a cold start: loading, shards 29/64, one fatal-free error line."""
    state = initial_state("kimi")
    p = ProcessSample(
        pid=4242,
        create_time=T0,
        pids=(4242, 4243),
        rss_bytes=14 * GiB,
        cpu_seconds=120.0,
        read_bytes=80 * GiB,
    )
    refused = ProbeResult(ProbeKind.HEALTH, ProbeOutcome.REFUSED, None, 0.0004, T0 + 40)
    bar = LogEvent(
        LogClass.PROGRESS,
        "Loading safetensors checkpoint shards: 29/64",
        T0 + 40,
        progress=(29, 64),
        progress_key="shards",
    )
    for t, gpu, events in ((39, 30 * GiB, ()), (40, 35 * GiB, (bar,))):
        state = step(
            state,
            Observation(
                "kimi", T0 + t, process=p, health=refused, gpu_memory_bytes=gpu, log_events=events
            ),
            T0 + t,
            Thresholds(expected_phase_seconds={Phase.INITIALIZING: 200.0}),
        )
    return state, p


def ready_state():
    state = initial_state("llama")
    ok = ProbeResult(ProbeKind.HEALTH, ProbeOutcome.OK, 200, 0.002, T0 + 40)
    p = ProcessSample(
        pid=77,
        create_time=T0 - 100,
        pids=(77,),
        rss_bytes=GiB,
        cpu_seconds=3.0,
        read_bytes=None,
        read_bytes_error="permission_denied",
    )
    state = step(state, Observation("llama", T0 + 40, process=p, health=ok), T0 + 40, Thresholds())
    counters = replace(
        state.counters,
        start_failures=((FailureReason.OOM, 2),),
        restarts=2,
        wakes=state.counters.wakes.observe(2.5),  # woken from sleep mode once
        deaths=((FailureReason.OOM, 1),),  # died of an OOM while serving once
    )
    previous = ColdStart(
        started_at=T0 - 800,
        ended_at=T0 - 110,
        outcome="ready",
        reason=None,
        phase_seconds=((Phase.STARTING, 40.0), (Phase.LOADING, 450.0), (Phase.INITIALIZING, 200.0)),
        longest_quiet_seconds=(),
        read_bytes=None,
        peak_gpu_bytes=None,
    )
    report = EngineReport(load_seconds=380.0, steps=(("weight_population", 300.0),))
    return replace(state, counters=counters, last_cold_start=previous, engine_report=report), p


def start_bounds(pid, *phases, finished=False):
    """What bounded each phase: a start's figures judged against a 3 GiB/s best."""
    start = StartFigures(pid, T0, tuple(phases), finished=finished)
    return verdicts(Bounds(current=start, best_read_bytes_per_second=3 * GiB), THRESHOLDS)


def snapshot():
    kimi, kp = loading_state()
    llama, lp = ready_state()
    gpus = tuple(
        GpuSample(
            index=i,
            uuid=f"GPU-{i:08x}",
            name="NVIDIA H200",
            up=i != 3,
            memory_used_bytes=(35 if i < 2 else 1) * GiB,
            memory_total_bytes=141 * GiB,
            memory_reserved_bytes=512 * 2**20,
            utilization_ratio=None if i == 2 else 0.0,
            memory_utilization_ratio=None if i == 2 else 0.01,
            pcie_rx_bytes_per_second=None if i == 2 else 24e9,
            error="gpu_lost" if i == 3 else None,
            # GPU 1 fell off the bus once and throttles on power; GPU 2 has an old driver
            xid_counts=((79, 1),) if i == 1 else (),
            ecc_uncorrected_volatile=None if i == 2 else 0,
            retired_pages_pending=None if i == 2 else False,
            remapped_rows_pending=None if i == 2 else i == 1,
            remapped_rows_failed=None if i == 2 else False,
            throttle_reasons=None if i == 2 else (0x84 if i == 1 else 0),
            pcie_link_generation=None if i == 2 else 5,
            pcie_link_generation_max=None if i == 2 else 5,
            pcie_link_width=None if i == 2 else (4 if i == 1 else 16),
            pcie_link_width_max=None if i == 2 else 16,
            unsupported=("ecc", "pcie_link", "remapped_rows", "retired_pages", "throttle")
            if i == 2
            else (),
        )
        for i in range(4)
    )
    return Snapshot(
        taken_at=T0 + 40,
        targets=(
            TargetSnapshot(
                TargetInfo("kimi", "sglang", "kimi-prod", "Kimi-K2"),
                kimi,
                kp,
                ((0, 35 * GiB), (1, 35 * GiB)),
                verdicts=start_bounds(
                    4242,
                    PhaseFigures(Phase.STARTING, 10.0, cpu_seconds=15.0),
                    PhaseFigures(Phase.LOADING, 30.0, read_bytes=80 * GiB, cpu_seconds=30.0),
                ),
            ),
            TargetSnapshot(
                TargetInfo("llama", "llamacpp"),
                llama,
                lp,
                typical_start_seconds=690.0,
                log_backlog_bytes=24 << 20,
                log_lag_seconds=3.0,
                orphaned_gpu_memory_bytes=((3, 70 * GiB),),  # left by its crashed instance
                verdicts=start_bounds(
                    77,
                    PhaseFigures(Phase.STARTING, 40.0, cpu_seconds=50.0),
                    PhaseFigures(Phase.LOADING, 450.0, memory_grown_bytes=8 * GiB),
                    PhaseFigures(
                        Phase.INITIALIZING, 200.0, gpu_busy_seconds=180.0, gpu_seconds=200.0
                    ),
                    finished=True,
                ),
            ),
        ),
        gpus=gpus,
        foreign_gpu_memory_bytes=((2, GiB),),
        host=HostReadings(
            disk=DiskSample(read_bytes=90 * GiB, devices=("nvme0n1",)),
            memory_pressure=MemoryPressure(0.25, 0.0625, 12.5, 3.0),
        ),
        sources=(
            SourceStatus("process", True, 0.0003, target="kimi"),
            SourceStatus("process", True, 0.0002, target="llama"),
            SourceStatus("nvml", False, 0.5, error="timeout"),
            SourceStatus("disk", True, 0.0001),
            # a unit's journal on a host without one: absent, which is no failure
            SourceStatus("logs", False, 0.00002, "missing", "kimi", absent=True, hint="-"),
        ),
        source_errors=(("nvml", 3),),
        tick_duration_seconds=0.012,
        tick_overruns=2,
        version="0.1.0",
    )


def render(snap, openmetrics=False):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, "0.1.0"))
    return (generate_openmetrics if openmetrics else generate_latest)(registry).decode()


MIG_A = "MIG-4b4c9a1e-6b0b-5e33-9c1f-3a5f0e2d7c11"
MIG_B = "MIG-8f2d6c3a-1e4b-5a77-b0c2-9d6e4f1a2b33"


def mig_snapshot() -> Snapshot:
    """GPU 0 cut into two 3g.71gb slices, kimi on the first; GPU 1 MIG-capable but off.

    This host also exports every GPU health reading (``gpu_health_metrics = "all"``), so the
    two golden files show both ways of exporting health.
    """
    snap = snapshot()
    gpus = (
        replace(snap.gpus[0], mig_enabled=True, mig_pending=True),
        replace(snap.gpus[1], mig_enabled=False, mig_pending=False),
        *snap.gpus[2:],
    )
    migs = (
        MigSample(0, MIG_A, 1, 0, "3g.71gb", 30 * GiB, 70 * GiB),
        MigSample(0, MIG_B, 2, 0, "3g.71gb", None, None),  # its memory call failed
    )
    kimi = replace(snap.targets[0], mig_memory_bytes=((MIG_A, 30 * GiB),))
    return replace(
        snap, gpus=gpus, migs=migs, targets=(kimi, *snap.targets[1:]), all_gpu_health=True
    )


@pytest.mark.parametrize(
    ("name", "make"), [("two-targets-four-gpus", snapshot), ("mig-two-slices", mig_snapshot)]
)
def test_golden_exposition(update_golden, name, make):
    text = render(make())
    golden = GOLDEN / f"{name}.prom"
    if update_golden:
        golden.write_text(text)
    assert text == golden.read_text(), "rerun with --update-golden and review the diff"


def test_an_absent_source_says_so_and_never_reads_as_down():
    text = render(snapshot())
    assert 'inference_exporter_source_absent{source="logs",target="kimi"} 1.0' in text
    assert 'inference_exporter_source_up{source="logs",target="kimi"}' not in text
    # a source that broke is down, not absent
    assert 'inference_exporter_source_up{source="nvml",target=""} 0.0' in text
    assert 'inference_exporter_source_absent{source="nvml"' not in text


def test_mig_devices_get_one_series_each_and_a_server_its_slice():
    text = render(mig_snapshot())
    a = f'gpu="0",gpu_i_id="1",mig_uuid="{MIG_A}",uuid="GPU-00000000"'
    assert f"inference_gpu_mig_memory_used_bytes{{{a}}} 3.221225472e+10" in text
    assert f"inference_gpu_mig_memory_total_bytes{{{a}}} 7.516192768e+10" in text
    assert re.search(
        r'inference_gpu_mig_info\{compute_i_id="0",gpu="0",gpu_i_id="2",'
        r'gpu_i_profile="3g.71gb",mig_uuid="' + MIG_B + r'",uuid="GPU-00000000"\} 1\.0',
        text,
    )
    assert f'mig_uuid="{MIG_B}"' not in text.split("inference_gpu_mig_memory_used_bytes", 1)[1]
    assert (
        f'inference_server_mig_memory_used_bytes{{gpu="0",mig_uuid="{MIG_A}",target="kimi"}}'
        in text
    )
    assert 'inference_gpu_mig_enabled{gpu="1",uuid="GPU-00000001"} 0.0' in text
    assert 'inference_gpu_mig_enabled{gpu="2"' not in text  # not MIG-capable: absent
    # bounded: at most 7 slices per GPU, each named by the driver, never by a pid
    mig_labels = {
        k for ln in text.splitlines() if "_mig_" in ln for k in re.findall(r'[{,](\w+)="', ln)
    }
    assert mig_labels == {
        "gpu",
        "uuid",
        "mig_uuid",
        "gpu_i_id",
        "compute_i_id",
        "gpu_i_profile",
        "target",
    }
    # the whole GPU's series stay as they are beside the slices
    assert 'inference_gpu_memory_used_bytes{gpu="0",uuid="GPU-00000000"}' in text


def test_a_host_without_mig_renders_no_mig_series():
    text = render(snapshot())
    assert "mig" not in text


def test_promtool_finds_nothing_to_complain_about(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) must be installed; make test does it"
    for snap in (snapshot(), mig_snapshot()):
        out = subprocess.run(
            [promtool, "check", "metrics"],
            input=render(snap),
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.strip() == "" and out.stderr.strip() == ""


def test_openmetrics_rendering_parses_and_ends_in_eof():
    text = render(snapshot(), openmetrics=True)
    assert text.endswith("# EOF\n")
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"inference_server_phase", "inference_server_restarts"} <= families


def test_every_phase_series_exists_from_the_first_scrape_with_exactly_one_set():
    text = render(snapshot())
    kimi = re.findall(r'inference_server_phase\{phase="(\w+)",target="kimi"\} (\S+)', text)
    assert sorted(p for p, _ in kimi) == sorted(p.value for p in Phase)
    assert [p for p, v in kimi if v == "1.0"] == ["loading"]


def test_unknown_values_are_absent_not_zero():
    text = render(snapshot())
    # llama's read bytes were denied: no series rather than a fake 0
    assert 'inference_server_process_read_bytes_total{target="llama"}' not in text
    assert 'inference_server_process_read_bytes_total{target="kimi"}' in text
    # GPU 2 does not support utilisation; GPU 3 is lost: its fields vanish, up says 0
    assert 'inference_gpu_utilization_ratio{gpu="2"' not in text
    assert 'inference_gpu_memory_used_bytes{gpu="3"' not in text
    assert re.search(r'inference_gpu_up\{gpu="3",uuid="GPU-00000003"\} 0\.0', text)
    # llama is ready: no ETA; kimi is loading with 29/64 shards
    assert 'inference_server_eta_seconds{target="llama"}' not in text
    assert re.search(r'inference_server_load_progress_ratio\{target="kimi"\} 0\.453', text)


def test_labels_are_bounded_and_secret_free():
    text = render(snapshot())
    labels = set(re.findall(r'[{,](\w+)="', text))
    assert labels <= {
        "target",
        "phase",
        "probe",
        "source",
        "gpu",
        "uuid",
        "engine",
        "deployment",
        "model",
        "reason",
        "class",
        "name",
        "version",
        "kind",
        "le",
        "namespace",
        "pod",
        "container",
        "vendor",
        "xid",
        "reading",
        "bound",
    }
    assert "4242" not in text  # never a pid
    # a discovered target's place in Kubernetes is joined on, never repeated per series
    placed = [ln for ln in text.splitlines() if re.search(r'[{,](namespace|pod|container)="', ln)]
    assert placed and all(ln.startswith("inference_server_info{") for ln in placed)


def _series(snap: Snapshot) -> int:
    return len([ln for ln in render(snap).splitlines() if ln and not ln.startswith("#")])


def _without_optional_features(t: TargetSnapshot) -> TargetSnapshot:
    """A target that never slept nor died, whose engine reports nothing, left nothing behind
    and has no start whose bounds were judged."""
    counters = replace(t.state.counters, wakes=Counters().wakes, deaths=())
    state = replace(t.state, counters=counters, engine_report=None)
    return replace(t, state=state, orphaned_gpu_memory_bytes=(), verdicts=Verdicts())


def _without_health(g: GpuSample) -> GpuSample:
    """The GPU as a driver without any health call reports it (every field up to ``error``)."""
    names = [f.name for f in fields(GpuSample)]
    return GpuSample(**{name: getattr(g, name) for name in names[: names.index("error") + 1]})


def test_series_budget_two_targets_eight_gpus_under_200():
    """STYLE.md's budget for the base host; each optional feature adds a bounded few."""
    snap = snapshot()
    healthy = tuple(replace(snap.gpus[0], index=i, uuid=f"GPU-{i}") for i in range(8))
    gpus = tuple(map(_without_health, healthy))
    base = replace(
        snap,
        gpus=gpus,
        targets=tuple(map(_without_optional_features, snap.targets)),
        sources=tuple(s for s in snap.sources if not s.absent),
    )
    typical = _series(base)
    assert typical < 200, typical
    # GPU health where the driver gives all of it: by default a healthy GPU adds no series
    assert _series(replace(base, gpus=healthy)) == typical
    # gpu_health_metrics = "all": ECC, retired pages, two remap flags, five throttle reasons
    # and four PCIe link gauges per GPU (Xid counters only once one came)
    assert _series(replace(base, gpus=healthy, all_gpu_health=True)) - typical == 8 * 13
    # one target woke once, died once, reports its load time and has one GPU held by its
    # leftovers;
    # bounds: one series per phase of a finished start (3 here), one per bound while starting
    # and an absent source has its duration and its absent gauge
    added = _series(replace(snap, gpus=gpus)) - typical
    assert added == (len(WAKE_BUCKETS) + 3) + 1 + 2 + 1 + 3 + len(Bound) + 2, added


def test_before_the_first_tick_only_build_info_is_rendered():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: None, "9.9"))
    text = generate_latest(registry).decode()
    assert 'inference_exporter_build_info{version="9.9"} 1.0' in text
    assert "inference_server_phase" not in text


def test_cold_start_histogram_counts_a_finished_start():
    state, p = loading_state()
    ok = ProbeResult(ProbeKind.HEALTH, ProbeOutcome.OK, 200, 0.002, T0 + 100)
    state = step(state, Observation("kimi", T0 + 100, process=p, health=ok), T0 + 100, Thresholds())
    snap = replace(snapshot(), targets=(TargetSnapshot(TargetInfo("kimi", "sglang"), state, p),))
    text = render(snap)
    assert 'inference_server_cold_start_duration_seconds_count{target="kimi"} 1.0' in text
    assert (
        'inference_server_cold_start_duration_seconds_bucket{le="120.0",target="kimi"} 1.0' in text
    )
    assert (
        'inference_server_cold_start_duration_seconds_bucket{le="60.0",target="kimi"} 0.0' in text
    )
    assert 'inference_server_last_cold_start_duration_seconds{target="kimi"} 100.0' in text


def test_gpu_health_shows_a_problem_only_while_it_lasts_unless_all_are_asked_for():
    snap = snapshot()  # GPU 1: Xid 79, remap pending, throttled, x4 of x16; GPU 0: healthy
    default = render(snap)
    every = render(replace(snap, all_gpu_health=True))

    def gpu_series(text: str, gpu: str) -> set[str]:
        return {
            line.split("{")[0]
            for line in text.splitlines()
            if line.startswith("inference_gpu_")
            and f'gpu="{gpu}"' in line
            and not line.startswith(("inference_gpu_up", "inference_gpu_info", "inference_gpu_mem"))
            and "utilization" not in line
            and "pcie_rx" not in line
        }

    assert gpu_series(default, "0") == set()  # a healthy GPU: no health series at all
    assert gpu_series(default, "1") == {
        "inference_gpu_xid_errors_total",
        "inference_gpu_remapped_rows_pending",
        "inference_gpu_clock_throttle_active",
        "inference_gpu_pcie_link_generation",
        "inference_gpu_pcie_link_generation_max",
        "inference_gpu_pcie_link_width",
        "inference_gpu_pcie_link_width_max",
    }
    assert 'reason="sw_thermal_slowdown"' not in default  # only the active reasons
    assert 'reason="sw_thermal_slowdown"' in every
    assert "inference_gpu_health_unsupported{" not in default
    assert "inference_gpu_ecc_uncorrected_volatile_errors_total" in gpu_series(every, "0")
    assert 'inference_gpu_health_unsupported{gpu="2"' in every
