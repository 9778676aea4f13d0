"""The daemon with ``[discovery.kubernetes]``: discovered targets come, learn and go.

The API server is the loopback fake of tests/discovery/fakeapi.py (no kube-apiserver runs
here); the daemon, its sources, history and the watcher are the real ones.
"""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest

from exporter.base.model import Phase
from exporter.base.records import ColdStart
from exporter.config import DockerDiscovery, KubernetesDiscovery, Settings, Target
from exporter.daemon import Daemon
from exporter.history import History
from tests.discovery.containers import CID_SGLANG, compose_vllm, docker_run_sglang
from tests.discovery.fakeapi import FakeApiServer, events
from tests.discovery.pods import NODE, sglang_statefulset_pod, vllm_deployment_pod
from tests.discovery.test_kubernetes import kubeconfig
from tests.sources.conftest import wait_for

pytestmark = pytest.mark.integration
FIRST = "inference/llama-70b-7d9c5b6f4d-x2k8q"
SGLANG = "llm/deepseek-r1-0"


@pytest.fixture
def api():
    server = FakeApiServer()
    yield server
    server.close()


def daemon_for(api, tmp_path, *, grace=0.5, targets=(), history=None):
    discovery = KubernetesDiscovery(
        node_name=NODE,
        kubeconfig=kubeconfig(tmp_path, api.url),
        grace_seconds=grace,
        probe_timeout_seconds=0.2,
    )
    settings = Settings(
        interval_seconds=0.5,
        state_directory=str(tmp_path),
        nvml=False,
        targets=tuple(targets),
        kubernetes=discovery,
        source_path="c.toml",
    )
    return Daemon(settings, history=history or History.open(None))


def target_names(daemon):
    return [t.info.name for t in daemon.tick().targets]


def test_discovered_pods_are_watched_beside_static_targets_and_dropped_after_grace(
    api, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="exporter.daemon")
    api.add(vllm_deployment_pod())
    api.add(vllm_deployment_pod(metadata__uid="x", metadata__name="elsewhere", spec__nodeName="n9"))
    deleted = copy.deepcopy(sglang_statefulset_pod())
    deleted["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    api.watches = [events(("ADDED", sglang_statefulset_pod()), end=False)]
    static = Target(
        name="static",
        engine="vllm",
        base_url="http://127.0.0.1:1",
        health_path="/health",
        probe_timeout_seconds=0.2,
    )
    daemon = daemon_for(api, tmp_path, targets=[static])
    try:
        wait_for(lambda: target_names(daemon) == ["static", FIRST, SGLANG])
        snap = daemon.tick()
        kubernetes = [s for s in snap.sources if s.source == "kubernetes"]
        assert [(s.up, s.error) for s in kubernetes] == [(True, None)]
        # A discovered engine with no process in its container's cgroup is down, not an error
        assert {t.info.name: t.state.phase for t in snap.targets}[FIRST] is Phase.DOWN
        info = {t.info.name: t.info for t in snap.targets}
        assert (info[FIRST].namespace, info[FIRST].pod, info[FIRST].container) == (
            "inference",
            "llama-70b-7d9c5b6f4d-x2k8q",
            "vllm",
        )
        assert (info["static"].namespace, info["static"].pod) == ("", "")

        api.watches = [events(("MODIFIED", deleted), end=False)]
        api.http.stopping.set()  # the silent watch ends; the next one brings the deletion
        wait_for(lambda: SGLANG not in target_names(daemon), timeout=15)
        assert "discovered target dropped target=llm/deepseek-r1-0" in caplog.text
    finally:
        daemon.close()


def predecessor_start() -> ColdStart:
    """A finished 612 s start, as the replica before the one under test recorded it."""
    return ColdStart(
        started_at=1000.0,
        ended_at=1000.0 + 612.0,
        outcome="ready",
        reason=None,
        phase_seconds=((Phase.STARTING, 40.0), (Phase.LOADING, 480.0), (Phase.INITIALIZING, 92.0)),
        longest_quiet_seconds=((Phase.INITIALIZING, 70.0),),
        read_bytes=None,
        peak_gpu_bytes=None,
    )


def test_a_new_replica_expects_the_start_time_its_predecessors_took(api, tmp_path):
    history = History.open(None)
    history.record("inference/Deployment/llama-70b/vllm", "vllm", "", predecessor_start())
    api.add(vllm_deployment_pod())  # a replica of the same Deployment, new name
    daemon = daemon_for(api, tmp_path, history=history)
    try:
        wait_for(lambda: target_names(daemon) == [FIRST])
        (target,) = daemon.tick().targets
        assert target.typical_start_seconds == 612.0
    finally:
        daemon.close()


def test_an_unreachable_api_server_is_a_source_down_and_the_daemon_ticks_on(tmp_path):
    api = FakeApiServer()
    api.close()  # nothing listens: connect refused
    daemon = daemon_for(api, tmp_path)

    def kubernetes_errors():
        return [s.error for s in daemon.tick().sources if s.source == "kubernetes"]

    try:
        # "not_synced" until the first list fails, then why it failed
        wait_for(lambda: kubernetes_errors() == ["connect_error"])
        assert daemon.tick().targets == ()
    finally:
        daemon.close()


def test_a_reload_keeps_the_watcher_when_discovery_is_unchanged_and_drops_it_when_off(
    api, tmp_path
):
    api.add(vllm_deployment_pod())
    daemon = daemon_for(api, tmp_path)
    try:
        wait_for(lambda: target_names(daemon) == [FIRST])
        lists = len([q for q in api.queries() if "watch" not in q])
        same = daemon.settings
        assert daemon.reload(lambda: same)
        assert target_names(daemon) == [FIRST]  # same watcher, no new list, target kept
        assert len([q for q in api.queries() if "watch" not in q]) == lists

        off = Settings(interval_seconds=0.5, state_directory=str(tmp_path), nvml=False)
        assert daemon.reload(lambda: off)
        snap = daemon.tick()
        assert snap.targets == ()
        assert not [s for s in snap.sources if s.source == "kubernetes"]
    finally:
        daemon.close()


def test_a_reload_onto_another_node_watches_its_pods_and_lets_the_old_ones_go(api, tmp_path):
    api.add(vllm_deployment_pod())
    api.add(vllm_deployment_pod(metadata__uid="y", metadata__name="there", spec__nodeName="n9"))
    daemon = daemon_for(api, tmp_path)
    try:
        wait_for(lambda: target_names(daemon) == [FIRST])
        moved = daemon.settings.kubernetes
        assert moved is not None
        settings = dataclasses.replace(
            daemon.settings, kubernetes=dataclasses.replace(moved, node_name="n9")
        )
        assert daemon.reload(lambda: settings)
        wait_for(lambda: target_names(daemon) == ["inference/there"])  # FIRST after its grace
        assert all("spec.nodeName=n9" in q["fieldSelector"] for q in api.queries()[-2:])
    finally:
        daemon.close()


def test_pods_and_containers_are_watched_together_and_a_reload_drops_only_docker(
    api, docker, tmp_path
):
    api.add(vllm_deployment_pod())
    docker.run(docker_run_sglang(), announce=False)
    both = dataclasses.replace(
        daemon_for(api, tmp_path).settings,
        docker=DockerDiscovery(socket=docker.socket, grace_seconds=60, probe_timeout_seconds=0.2),
    )
    daemon = Daemon(both, history=History.open(None))
    try:
        wait_for(lambda: target_names(daemon) == [FIRST, "sglang"])
        sources = {s.source: s.up for s in daemon.tick().sources}
        assert sources["kubernetes"] and sources["docker"]
        lists = len([q for q in api.queries() if "watch" not in q])
        # Docker off: its targets go at once (not after its minute of grace), pods stay.
        assert daemon.reload(lambda: dataclasses.replace(both, docker=None))
        snap = daemon.tick()
        assert [t.info.name for t in snap.targets] == [FIRST]
        assert "docker" not in {s.source for s in snap.sources}
        assert len([q for q in api.queries() if "watch" not in q]) == lists  # same watcher
        docker.destroy(CID_SGLANG)
    finally:
        daemon.close()


def test_a_recreated_compose_container_expects_the_start_time_of_the_one_it_replaced(
    docker, tmp_path
):
    history = History.open(None)
    history.record("compose/serving/llm", "vllm", "", predecessor_start())
    docker.run(compose_vllm(Id="6" * 64, Name="/serving-llm-2"), announce=False)
    settings = Settings(
        interval_seconds=0.5,
        state_directory=str(tmp_path),
        nvml=False,
        docker=DockerDiscovery(socket=docker.socket, probe_timeout_seconds=0.2),
        source_path="c.toml",
    )
    daemon = Daemon(settings, history=history)
    try:
        wait_for(lambda: target_names(daemon) == ["serving-llm-2"])
        (target,) = daemon.tick().targets
        assert target.typical_start_seconds == 612.0
    finally:
        daemon.close()
