"""Pod objects shaped as the API server returns them (trimmed of fields discovery never reads).

Shapes follow real ``kubectl get pod -o json`` output of each workload kind: a Deployment's
pod is owned by its ReplicaSet ``<deployment>-<pod-template-hash>``, a StatefulSet's by the
set, a LeaderWorkerSet's by the StatefulSet the LWS controller made, with the LWS labels.
"""

from __future__ import annotations

import copy
from typing import Any

NODE = "gpu-node-7"
CID_VLLM = "8f3e1c0a9b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f"
CID_SGLANG = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809"
CID_SIDECAR = "f" * 64


def _pod(
    name: str,
    namespace: str,
    uid: str,
    *,
    owner: tuple[str, str] | None,
    containers: list[dict[str, Any]],
    statuses: list[dict[str, Any]],
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    ip: str | None = "10.244.3.17",
    phase: str = "Running",
    node: str = NODE,
    version: str = "48213",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": version,
        "creationTimestamp": "2026-11-30T09:12:44Z",
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner is not None:
        kind, owner_name = owner
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": owner_name,
                "uid": "0c6b1b1e-3c55-4d0e-a3f2-7d2c6b0f1a11",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": "192.168.10.7",
        "qosClass": "Burstable",
        "containerStatuses": statuses,
    }
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": containers, "restartPolicy": "Always"},
        "status": status,
    }


def _running(name: str, cid: str, runtime: str = "containerd") -> dict[str, Any]:
    return {
        "name": name,
        "containerID": f"{runtime}://{cid}",
        "image": "docker.io/vllm/vllm-openai:v0.6.3",
        "ready": False,
        "restartCount": 0,
        "started": True,
        "state": {"running": {"startedAt": "2026-11-30T09:13:02Z"}},
    }


def vllm_deployment_pod(**changes: Any) -> dict[str, Any]:
    """A vLLM Deployment's replica, annotated, one container, containerd."""
    pod = _pod(
        "llama-70b-7d9c5b6f4d-x2k8q",
        "inference",
        "5b0e6a0c-2f7e-4d8a-9c61-3e2f1d0c9b8a",
        owner=("ReplicaSet", "llama-70b-7d9c5b6f4d"),
        labels={"app": "llama-70b", "pod-template-hash": "7d9c5b6f4d"},
        annotations={
            "inference-lifecycle.io/engine": "vllm",
            "inference-lifecycle.io/completion-model": "meta-llama/Llama-3.1-70B-Instruct",
        },
        containers=[
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.6.3",
                "args": [
                    "--model",
                    "meta-llama/Llama-3.1-70B-Instruct",
                    "--tensor-parallel-size",
                    "4",
                ],
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
            }
        ],
        statuses=[_running("vllm", CID_VLLM)],
    )
    for key, value in changes.items():
        _set(pod, key, value)
    return pod


def sglang_statefulset_pod() -> dict[str, Any]:
    """An SGLang StatefulSet's pod annotated by label, CRI-O, a custom port and health path."""
    return _pod(
        "deepseek-r1-0",
        "llm",
        "9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4",
        owner=("StatefulSet", "deepseek-r1"),
        labels={
            "app": "deepseek-r1",
            "statefulset.kubernetes.io/pod-name": "deepseek-r1-0",
            "inference-lifecycle.io/engine": "sglang",
        },
        annotations={
            "inference-lifecycle.io/port": "30000",
            "inference-lifecycle.io/health-path": "/health_generate",
            "inference-lifecycle.io/model-path": "/models/deepseek-r1",
        },
        containers=[
            {
                "name": "sglang",
                "image": "lmsysorg/sglang:v0.4.1-cu124",
                "command": ["python3", "-m", "sglang.launch_server"],
                "args": ["--model-path", "/models/deepseek-r1", "--port", "30000"],
            }
        ],
        statuses=[_running("sglang", CID_SGLANG, runtime="cri-o")],
        ip="fd00:10:244::1f",
    )


def lws_pod(worker_index: str) -> dict[str, Any]:
    """A LeaderWorkerSet group's leader ("0") or worker, owned by the LWS's StatefulSet."""
    name = "kimi-k2-0" if worker_index == "0" else f"kimi-k2-0-{worker_index}"
    owner = "kimi-k2" if worker_index == "0" else "kimi-k2-0"
    return _pod(
        name,
        "inference",
        f"3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b{worker_index.zfill(2)}",
        owner=("StatefulSet", owner),
        labels={
            "leaderworkerset.sigs.k8s.io/name": "kimi-k2",
            "leaderworkerset.sigs.k8s.io/group-index": "0",
            "leaderworkerset.sigs.k8s.io/worker-index": worker_index,
            "leaderworkerset.sigs.k8s.io/group-key": "6b7f0e5c1d",
        },
        annotations={"inference-lifecycle.io/engine": "sglang"},
        containers=[
            {
                "name": "sglang",
                "image": "lmsysorg/sglang:v0.4.1-cu124",
                "ports": [{"containerPort": 30000}],
            }
        ],
        statuses=[_running("sglang", CID_SGLANG)],
    )


def two_container_pod() -> dict[str, Any]:
    """A pod with an engine and a metrics sidecar; the annotation picks the engine container."""
    return _pod(
        "qwen-5f6d8b9c7-abcde",
        "inference",
        "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d",
        owner=("ReplicaSet", "qwen-5f6d8b9c7"),
        labels={"pod-template-hash": "5f6d8b9c7"},
        annotations={
            "inference-lifecycle.io/engine": "vllm",
            "inference-lifecycle.io/container": "engine",
        },
        containers=[
            {
                "name": "proxy",
                "image": "envoyproxy/envoy:v1.31",
                "ports": [{"containerPort": 9901}],
            },
            {
                "name": "engine",
                "image": "vllm/vllm-openai:v0.6.3",
                "ports": [{"containerPort": 8080}],
            },
        ],
        statuses=[_running("proxy", CID_SIDECAR), _running("engine", CID_VLLM)],
    )


def plain_pod() -> dict[str, Any]:
    """A pod without the annotation, running an image that names an engine."""
    return _pod(
        "scratch-vllm",
        "research",
        "11111111-2222-4333-8444-555555555555",
        owner=None,
        containers=[
            {
                "name": "server",
                "image": "vllm/vllm-openai:latest",
                "ports": [{"containerPort": 8000}],
            },
            {"name": "shell", "image": "busybox:1.36", "command": ["sleep", "infinity"]},
        ],
        statuses=[_running("server", CID_VLLM, runtime="docker")],
    )


def _set(pod: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a__b__c`` (a path in the pod; ``None`` deletes the key)."""
    *parents, last = dotted.split("__")
    node = pod
    for key in parents:
        node = node[key]
    if value is None:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)
