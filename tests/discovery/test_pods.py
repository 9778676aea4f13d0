"""Pod objects -> targets: what an operator annotating a pod gets, and what is left alone."""

from __future__ import annotations

import pytest

from exporter.config import KubernetesDiscovery, PodRef, PodSelection
from exporter.discovery.pods import targets_from_pod
from tests.discovery.pods import (
    CID_SGLANG,
    CID_VLLM,
    NODE,
    lws_pod,
    plain_pod,
    sglang_statefulset_pod,
    two_container_pod,
    vllm_deployment_pod,
)

SETTINGS = KubernetesDiscovery(node_name=NODE)


def only(pod, settings=SETTINGS):
    found = targets_from_pod(pod, settings)
    assert len(found) == 1, found
    return found[0]


def test_an_annotated_deployment_pod_is_probed_on_its_ip_and_found_by_its_container():
    found = only(vllm_deployment_pod())
    t = found.target
    assert t.name == "inference/llama-70b-7d9c5b6f4d-x2k8q"
    assert (t.engine, t.base_url, t.health_url) == (
        "vllm",
        "http://10.244.3.17:8000",
        "http://10.244.3.17:8000/health",
    )
    assert t.container_id == CID_VLLM  # "containerd://" stripped
    assert t.completion is not None and t.completion.model == "meta-llama/Llama-3.1-70B-Instruct"
    assert found.where == PodRef("inference", "llama-70b-7d9c5b6f4d-x2k8q", "vllm")
    assert found.pod_uid == "5b0e6a0c-2f7e-4d8a-9c61-3e2f1d0c9b8a"


def test_a_new_replica_of_a_deployment_shares_its_history_key_even_after_a_rollout():
    first = only(vllm_deployment_pod()).target
    replica = only(
        vllm_deployment_pod(
            metadata__name="llama-70b-55c8f9d7b-q9w2e",
            metadata__labels={"pod-template-hash": "55c8f9d7b"},
            metadata__ownerReferences=[
                {"kind": "ReplicaSet", "name": "llama-70b-55c8f9d7b", "controller": True}
            ],
        )
    ).target
    assert replica.name != first.name
    assert replica.history_name == first.history_name == "inference/Deployment/llama-70b/vllm"


def test_a_statefulset_pod_annotated_by_label_with_port_health_path_and_ipv6():
    t = only(sglang_statefulset_pod()).target
    assert t.engine == "sglang"
    assert t.health_url == "http://[fd00:10:244::1f]:30000/health_generate"
    assert t.container_id == CID_SGLANG  # "cri-o://" stripped
    assert t.model_path == "/models/deepseek-r1"
    assert t.completion is None and t.model == ""
    assert t.history_name == "llm/StatefulSet/deepseek-r1/sglang"


def test_leaderworkerset_leaders_and_workers_learn_from_their_own_role():
    leader, worker = only(lws_pod("0")).target, only(lws_pod("1")).target
    other_worker = only(lws_pod("2")).target
    assert leader.history_name == "inference/LeaderWorkerSet/kimi-k2/leader/sglang"
    assert worker.history_name == other_worker.history_name
    assert worker.history_name == "inference/LeaderWorkerSet/kimi-k2/worker/sglang"
    assert leader.base_url == "http://10.244.3.17:30000"  # the container's only port


def test_the_container_annotation_picks_the_engine_out_of_two():
    found = only(two_container_pod())
    assert found.where.container == "engine"
    assert found.target.base_url.endswith(":8080")
    assert found.target.container_id == CID_VLLM
    assert found.target.name == "inference/qwen-5f6d8b9c7-abcde"  # one selected: no suffix


def test_a_pod_without_the_annotation_is_left_alone_unless_images_are_selected():
    assert targets_from_pod(plain_pod(), SETTINGS) == []
    by_image = KubernetesDiscovery(node_name=NODE, select=PodSelection.ANNOTATED_OR_IMAGE)
    found = only(plain_pod(), by_image)  # busybox is no engine
    assert (found.target.engine, found.where.container) == ("vllm", "server")
    assert found.target.container_id == CID_VLLM  # "docker://" stripped
    assert found.target.history_name == "research/Pod/scratch-vllm/server"


def test_two_selected_containers_get_the_container_in_their_names():
    pod = plain_pod()
    pod["spec"]["containers"][1] = {
        "name": "embedder",
        "image": "ghcr.io/huggingface/text-generation-inference:2.4",
        "args": ["text-generation-launcher", "--port", "8081"],
        "ports": [{"containerPort": 8081}],
    }
    by_image = KubernetesDiscovery(
        node_name=NODE, select=PodSelection.ANNOTATED_OR_IMAGE, name_template="{pod}"
    )
    found = targets_from_pod(pod, by_image)
    assert [(t.target.name, t.target.engine) for t in found] == [
        ("scratch-vllm/server", "vllm"),
        ("scratch-vllm/embedder", "tgi"),
    ]
    assert found[1].target.container_id == ""  # not created yet: nothing is its process


@pytest.mark.parametrize(
    ("why", "changes"),
    [
        ("being deleted", {"metadata__deletionTimestamp": "2026-11-30T10:00:00Z"}),
        ("finished", {"status__phase": "Failed"}),
        (
            "no IP yet: no sandbox, nothing runs",
            {"status__podIP": None, "status__phase": "Pending"},
        ),
        (
            "an engine the exporter does not know",
            {"metadata__annotations": {"inference-lifecycle.io/engine": "nope"}},
        ),
        (
            "the annotated container does not exist",
            {
                "metadata__annotations": {
                    "inference-lifecycle.io/engine": "vllm",
                    "inference-lifecycle.io/container": "gone",
                }
            },
        ),
        (
            "a port that is no port",
            {
                "metadata__annotations": {
                    "inference-lifecycle.io/engine": "vllm",
                    "inference-lifecycle.io/port": "http",
                }
            },
        ),
    ],
)
def test_pods_with_nothing_to_watch_give_no_target(why, changes):
    assert targets_from_pod(vllm_deployment_pod(**changes), SETTINGS) == [], why


def test_a_pending_pod_with_an_ip_is_watched_before_its_container_exists():
    pod = vllm_deployment_pod(status__phase="Pending")
    pod["status"]["containerStatuses"] = [
        {
            "name": "vllm",
            "ready": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}},
        }
    ]
    assert only(pod).target.container_id == ""


def test_annotations_that_would_break_a_probe_or_a_label_fall_back_to_defaults():
    pod = vllm_deployment_pod()
    pod["metadata"]["annotations"].update(
        {
            "inference-lifecycle.io/health-path": "health check",
            "inference-lifecycle.io/completion-model": "llama\nfake_metric 1",
            "inference-lifecycle.io/model-path": "models/llama",
        }
    )
    t = only(pod).target
    assert t.health_path == "/health"  # vLLM's own
    assert t.model == "" and t.completion is None
    assert t.model_path is None  # relative to what? the exporter's working directory is no one's


@pytest.mark.parametrize(
    ("image", "command", "engine"),
    [
        # Issue 33: Dynamo's images name the engine its workers run; its own words win
        (
            "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.0",
            ["python3", "-m", "dynamo.frontend"],
            "dynamo",
        ),
        (
            "nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.4.0",
            ["python3", "-m", "dynamo.sglang"],
            "dynamo",
        ),
        ("ghcr.io/ericlbuehler/mistral.rs:cuda-90-latest", [], "mistralrs"),
        ("localai/localai:latest-gpu-nvidia-cuda-12", [], "localai"),
        ("ghcr.io/theroyallab/tabbyapi:latest", [], "tabbyapi"),
        ("xprobe/xinference:v1.2.0", ["xinference-local", "-H", "0.0.0.0"], "xinference"),
        ("rayproject/ray-llm:2.44.0", ["serve", "run", "config.yaml"], "rayserve"),
        ("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3", [], "nim"),
        (
            "ghcr.io/modeltc/lightllm:main",
            ["python", "-m", "lightllm.server.api_server"],
            "lightllm",
        ),
        ("alpindale/aphrodite-openai:latest", [], "aphrodite"),
        # and the engines that were there keep their images
        ("vllm/vllm-openai:v0.6.3", [], "vllm"),
        ("lmsysorg/sglang:v0.4.1-cu124", [], "sglang"),
    ],
)
def test_an_image_or_command_names_its_engine(image, command, engine):
    pod = plain_pod()
    pod["spec"]["containers"][0].update(image=image, command=command)
    by_image = KubernetesDiscovery(node_name=NODE, select=PodSelection.ANNOTATED_OR_IMAGE)
    assert only(pod, by_image).target.engine == engine
