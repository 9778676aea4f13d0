"""Container inspections shaped as ``GET /containers/{id}/json`` answers them (trimmed).

Shapes follow real ``docker inspect`` output (Docker 27) and ``podman inspect`` through
Podman's Docker-compatible API (Podman 5): a compose-started container carries the
``com.docker.compose.*`` labels, a published port shows in ``NetworkSettings.Ports`` as
``{"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8000"}, {"HostIp": "::", ...}]}``, and a
rootless Podman container on ``pasta`` has no container IP at all.
"""

from __future__ import annotations

import copy
from typing import Any

CID_COMPOSE = "3f9a2c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a"
CID_SGLANG = "b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1"
CID_PODMAN = "5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d"
CID_PLAIN = "9" * 64


def _container(
    cid: str,
    name: str,
    image: str,
    labels: dict[str, str],
    *,
    exposed: tuple[int, ...] = (),
    published: dict[int, list[dict[str, str]]] | None = None,
    ip: str = "172.18.0.3",
    networks: dict[str, str] | None = None,
    running: bool = True,
    pid: int = 41233,
    network_mode: str = "bridge",
) -> dict[str, Any]:
    ports: dict[str, Any] = {f"{p}/tcp": None for p in exposed}
    ports.update({f"{p}/tcp": b for p, b in (published or {}).items()})
    return {
        "Id": cid,
        "Created": "2026-12-01T22:10:04.118273912Z",
        "Path": "python3",
        "Args": ["-m", "server", "--api-key", "sk-not-for-labels"],
        "State": {
            "Status": "running" if running else "exited",
            "Running": running,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": False,
            "Pid": pid if running else 0,
            "ExitCode": 0,
            "StartedAt": "2026-12-01T22:10:05.004118Z",
        },
        "Image": "sha256:" + "ab" * 32,
        "Name": name,
        "RestartCount": 0,
        "HostConfig": {"NetworkMode": network_mode, "Runtime": "nvidia"},
        "Config": {
            "Hostname": cid[:12],
            "ExposedPorts": {f"{p}/tcp": {} for p in exposed},
            "Env": ["HF_TOKEN=hf_secret_never_logged"],
            "Cmd": ["--model", "/models/llama"],
            "Image": image,
            "Labels": labels,
        },
        "NetworkSettings": {
            "Ports": ports,
            "IPAddress": ip if network_mode == "bridge" else "",
            "Networks": {
                net: {"IPAddress": addr, "Gateway": "172.18.0.1", "MacAddress": "02:42:ac:12:00:03"}
                for net, addr in (networks or {}).items()
            },
        },
    }


def compose_vllm(**changes: Any) -> dict[str, Any]:
    """``docker compose up`` of service ``llm`` in project ``serving``: no published port,
    reached on its network's IP (compose containers leave the default bridge's IP empty)."""
    c = _container(
        CID_COMPOSE,
        "/serving-llm-1",
        "vllm/vllm-openai:v0.8.5",
        {
            "com.docker.compose.project": "serving",
            "com.docker.compose.service": "llm",
            "com.docker.compose.container-number": "1",
            "com.docker.compose.config-hash": "e1" * 32,
            "inference-lifecycle.io/engine": "vllm",
            "inference-lifecycle.io/port": "8000",
            "inference-lifecycle.io/completion-model": "meta-llama/Llama-3.1-8B-Instruct",
            "inference-lifecycle.io/model-path": "/models/llama",
        },
        exposed=(8000,),
        ip="",
        networks={"serving_default": "172.20.0.5"},
    )
    return _change(c, changes)


def docker_run_sglang(**changes: Any) -> dict[str, Any]:
    """``docker run -p 30000:30000 --label inference-lifecycle.io/engine=sglang``."""
    c = _container(
        CID_SGLANG,
        "/sglang",
        "lmsysorg/sglang:v0.4.6-cu124",
        {"inference-lifecycle.io/engine": "sglang", "inference-lifecycle.io/port": "30000"},
        exposed=(30000,),
        published={
            30000: [
                {"HostIp": "0.0.0.0", "HostPort": "30000"},
                {"HostIp": "::", "HostPort": "30000"},
            ]
        },
        ip="172.17.0.2",
        networks={"bridge": "172.17.0.2"},
    )
    return _change(c, changes)


def podman_vllm(**changes: Any) -> dict[str, Any]:
    """Rootless ``podman run -p 127.0.0.1:8001:8000``: the port bound to loopback only,
    no container IP (pasta networking); the port comes from the image's EXPOSE."""
    c = _container(
        CID_PODMAN,
        "vllm-podman",  # Podman's compatible API names it without Docker's leading slash
        "quay.io/vllm/vllm-openai:latest",
        {"inference-lifecycle.io/engine": "vllm", "io.podman.annotations.autoremove": "FALSE"},
        exposed=(8000,),
        published={8000: [{"HostIp": "127.0.0.1", "HostPort": "8001"}]},
        ip="",
    )
    return _change(c, changes)


def unlabelled(**changes: Any) -> dict[str, Any]:
    """A plain ``docker run vllm/vllm-openai``: no label, so not ours to watch."""
    c = _container(CID_PLAIN, "/stray", "vllm/vllm-openai:v0.8.5", {}, exposed=(8000,))
    return _change(c, changes)


def _change(container: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Apply ``Section__Field=value`` changes (``State__Running=False``)."""
    result = copy.deepcopy(container)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = result
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return result
