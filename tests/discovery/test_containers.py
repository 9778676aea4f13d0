"""Docker / Podman inspections -> targets: selection by label, names, URLs, history keys."""

from __future__ import annotations

from exporter.config import DockerDiscovery
from exporter.discovery.containers import target_from_container
from tests.discovery.containers import (
    CID_COMPOSE,
    CID_PODMAN,
    CID_SGLANG,
    compose_vllm,
    docker_run_sglang,
    podman_vllm,
    unlabelled,
)

SETTINGS = DockerDiscovery()


def test_a_compose_service_is_probed_on_its_network_ip_and_learns_from_its_service():
    found = target_from_container(compose_vllm(), SETTINGS)
    assert found is not None
    t = found.target
    assert (t.name, t.engine, t.base_url) == ("serving-llm-1", "vllm", "http://172.20.0.5:8000")
    assert t.history_key == "compose/serving/llm"  # a recreated container keeps its history
    assert t.container_id == CID_COMPOSE and found.pod_uid == CID_COMPOSE
    assert t.completion is not None and t.completion.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert t.model_path == "/models/llama" and t.health_path == "/health"
    assert found.where.container == "serving-llm-1"  # the name is the label, never the ID


def test_a_recreated_compose_container_shares_its_predecessors_history_key():
    again = compose_vllm(Id="7" * 64, Name="/serving-llm-2")
    first, second = (target_from_container(c, SETTINGS) for c in (compose_vllm(), again))
    assert first is not None and second is not None
    assert first.target.history_key == second.target.history_key
    assert first.target.name != second.target.name


def test_a_published_port_is_probed_on_loopback_and_the_name_is_without_its_slash():
    found = target_from_container(docker_run_sglang(), SETTINGS)
    assert found is not None
    t = found.target
    assert (t.name, t.engine, t.base_url) == ("sglang", "sglang", "http://127.0.0.1:30000")
    assert t.history_key == "docker/sglang" and t.container_id == CID_SGLANG


def test_podman_loopback_binding_and_exposed_port_without_a_port_label():
    found = target_from_container(podman_vllm(), SETTINGS)
    assert found is not None
    assert (found.target.name, found.target.base_url) == ("vllm-podman", "http://127.0.0.1:8001")
    assert found.target.container_id == CID_PODMAN


def test_unlabelled_stopped_unknown_engine_and_portless_containers_give_nothing():
    assert target_from_container(unlabelled(), SETTINGS) is None
    assert target_from_container(compose_vllm(State__Running=False), SETTINGS) is None
    labels = dict(docker_run_sglang()["Config"]["Labels"], **{"inference-lifecycle.io/engine": "x"})
    assert target_from_container(docker_run_sglang(Config__Labels=labels), SETTINGS) is None
    no_port = podman_vllm(Config__ExposedPorts={})
    assert target_from_container(no_port, SETTINGS) is None
    bad = dict(docker_run_sglang()["Config"]["Labels"], **{"inference-lifecycle.io/port": "0"})
    assert target_from_container(docker_run_sglang(Config__Labels=bad), SETTINGS) is None


def test_host_networking_probes_loopback_and_the_template_names_compose_services():
    host = compose_vllm(HostConfig__NetworkMode="host", NetworkSettings__Networks={})
    named = DockerDiscovery(name_template="{project}/{service}")
    found = target_from_container(host, named)
    assert found is not None
    assert (found.target.name, found.target.base_url) == ("serving/llm", "http://127.0.0.1:8000")


def test_no_secret_or_command_line_reaches_the_target():
    found = target_from_container(docker_run_sglang(), SETTINGS)
    assert found is not None
    text = repr(found)
    assert "sk-not-for-labels" not in text and "hf_secret" not in text
