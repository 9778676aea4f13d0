"""The README's engine probes, driven by the kubelet's documented rules, against real processes.

The kubelet is emulated (tests/integration/kubelet.py: no kubelet runs here) on a clock
scaled 1:20 (a 10 s period is 0.5 s); the exporter and the engine (the simulator) are real.
The probes are the README's, as a user would paste them.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.harness import ROOT, Simulator, exporter, simulator, stop, target_toml
from tests.integration.kubelet import Kubelet, manifest_in

pytestmark = pytest.mark.integration
SCALE = 0.05
INTERVAL = 0.25
README = (ROOT / "README.md").read_text()
#: The README's probes; the pod it names (a discovered target) is our static target here.
SPEC = manifest_in(
    README, "### Probes that know a slow load from a hang", {"target=llm/vllm-0": "target=vllm-0"}
)
NAME = "vllm-0"
STALL = 'starting = "20s"\nloading = "2s"\ninitializing = "20s"'


def kubelet_for(sim: Simulator, exporter_port: int, *, then: str | None = None) -> Kubelet:
    """The kubelet of the engine's pod; a restart starts the container again (as ``then``)."""

    def restart() -> None:
        assert sim.proc is not None and sim.proc.stdout is not None
        stop(sim.proc)
        sim.proc.stdout.close()
        if then is not None:
            at = sim.command.index("--scenario") + 1
            sim.command[at] = then
        sim.launch()

    return Kubelet(
        SPEC,
        ports={10049: exporter_port, 8000: sim.port},
        restart=restart,
        alive=lambda: sim.proc is not None and sim.proc.poll() is None,
        scale=SCALE,
    )


def period_x_threshold(kind: str) -> float:
    spec = SPEC[kind]
    return spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3) * SCALE


def test_a_slow_start_that_progresses_is_never_restarted_and_ready_only_when_the_engine_is(
    tmp_path,
):
    """Before (startupProbe on /probe, livenessProbe on /health): restarted at every load."""
    with (
        simulator(tmp_path, engine="vllm", scenario="slow", weights_mb=24, read_mbps=6.0) as sim,
        exporter(tmp_path, target_toml(NAME, sim, engine="vllm", completion=False)) as exp,
    ):
        kubelet = kubelet_for(sim, exp.port)
        began = time.monotonic()
        kubelet.run_for(60, until=lambda k: k.ready_since is not None or bool(k.restarts))
        assert kubelet.restarts == [], kubelet.restarts
        assert kubelet.ready_since is not None, "never ready"
        took = kubelet.ready_since - began
        assert took > 3 * period_x_threshold("livenessProbe")  # longer than any one window
        exp.wait_for(lambda t: t["phase"] in ("ready", "serving"), NAME, timeout=5)  # a tick on
        kubelet.run_for(2)
        assert kubelet.restarts == [] and kubelet.ready_since is not None


def test_a_hang_is_restarted_after_its_stall_threshold_plus_period_x_threshold(tmp_path):
    with (
        simulator(
            tmp_path, engine="vllm", scenario="hang-loading", weights_mb=32, read_mbps=16
        ) as sim,
        exporter(
            tmp_path, target_toml(NAME, sim, engine="vllm", stall=STALL, completion=False)
        ) as exp,
    ):
        exp.wait_for(lambda t: t["phase"] == "loading", NAME)
        loading = time.monotonic()
        kubelet = kubelet_for(sim, exp.port)
        kubelet.run_for(40, until=lambda k: bool(k.restarts))
        assert [why for _, why in kubelet.restarts] == ["liveness"]
        after = kubelet.restarts[0][0] - loading
        window = period_x_threshold("livenessProbe")
        assert after >= 2.0 + window - 2 * INTERVAL  # not before the stall threshold
        # the hang comes within about 1 s of loading; then a tick, a period, and slack for a
        # host under the whole suite's load (a tick came 0.16 s past a 2 s slack in one run)
        period = SPEC["livenessProbe"]["periodSeconds"] * SCALE
        assert after <= 1.0 + 2.0 + window + period + 3.0
        assert kubelet.readiness == [(kubelet.readiness[0][0], False)]  # never ready


def test_a_crash_is_restarted_and_the_next_start_is_not_held_against_it(tmp_path):
    with (
        simulator(tmp_path, engine="vllm", scenario="crash-loading") as sim,
        exporter(tmp_path, target_toml(NAME, sim, engine="vllm", completion=False)) as exp,
    ):
        kubelet = kubelet_for(sim, exp.port, then="healthy")
        kubelet.run_for(60, until=lambda k: k.ready_since is not None)
        assert [why for _, why in kubelet.restarts] == ["exited"]  # the crash, nothing after
        assert kubelet.ready_since is not None and kubelet.ready_since > kubelet.restarts[0][0]
        kubelet.run_for(2)
        assert len(kubelet.restarts) == 1
        exp.wait_for(lambda t: t["phase"] in ("ready", "serving"), NAME, timeout=5)
