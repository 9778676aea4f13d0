"""Docker / Podman container inspections -> targets: which ones, their names, probes, history.

Pure: takes a container as ``GET /containers/{id}/json`` answers it (already parsed) and the
discovery settings; no I/O, no clock. Selection and probe settings use the same
``inference-lifecycle.io/*`` keys as Kubernetes, here as container labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from exporter.config import DockerDiscovery, PodRef
from exporter.discovery.pods import (
    PREFIX,
    DiscoveredTarget,
    field_obj,
    field_str,
    labelled_target,
    parse_port,
)
from exporter.engines import ENGINES

#: The label that selects a container; its value names the engine.
ENGINE_LABEL: Final = PREFIX + "engine"
_COMPOSE: Final = "com.docker.compose."
# A port published on every address is reached on loopback; the exporter runs on the host.
_ANY_ADDRESS: Final = frozenset({"", "0.0.0.0", "::"})


def target_from_container(
    inspect: Mapping[str, object], settings: DockerDiscovery
) -> DiscoveredTarget | None:
    """The target of one inspected container; None when it has nothing to watch.

    Nothing to watch: no ``inference-lifecycle.io/engine`` label (or an unknown engine), not
    running (the daemon keeps a gone one's last state for the grace period), or no port to
    probe. ``container_id`` is the full ID, so the process finder reads it in the cgroup path;
    it never becomes a label value (the container's name does, on ``inference_server_info``).
    """
    config, state = field_obj(inspect, "Config"), field_obj(inspect, "State")
    labels = field_obj(config, "Labels")
    engine = ENGINES.get(field_str(labels, ENGINE_LABEL))
    container_id, name = field_str(inspect, "Id"), field_str(inspect, "Name").lstrip("/")
    if engine is None or state.get("Running") is not True or not container_id or not name:
        return None
    port = _port(labels, config)
    base_url = _base_url(inspect, port) if port is not None else None
    if base_url is None:
        return None
    project, service = (
        field_str(labels, _COMPOSE + "project"),
        field_str(labels, _COMPOSE + "service"),
    )
    target = labelled_target(
        lambda key: field_str(labels, PREFIX + key),
        name=settings.name_template.format(
            container=name, service=service or name, project=project
        ),
        engine=engine,
        base_url=base_url,
        container_id=container_id,
        # A recreated container (``compose up`` after a change) is the same server: it learns
        # from its predecessor's starts through the compose service, else through its name.
        history_key=f"compose/{project}/{service}" if project and service else f"docker/{name}",
        pod=PodRef("", "", name),
        probe_timeout_seconds=settings.probe_timeout_seconds,
    )
    return DiscoveredTarget(target, container_id)


def _port(labels: Mapping[str, object], config: Mapping[str, object]) -> int | None:
    """The labelled container port, else the lowest TCP port the image exposes."""
    labelled = field_str(labels, PREFIX + "port")
    if labelled:
        return parse_port(labelled)
    exposed = [parse_port(k.removesuffix("/tcp")) for k in field_obj(config, "ExposedPorts")]
    ports = sorted(p for p in exposed if p is not None)
    return ports[0] if ports else None


def _base_url(inspect: Mapping[str, object], port: int) -> str | None:
    """Where the engine answers from the host: its published port, else the container's IP.

    Host networking (``--network host``) shares the host's stack: loopback and the port itself.
    """
    network = field_obj(inspect, "NetworkSettings")
    bindings = field_obj(network, "Ports").get(f"{port}/tcp")
    for binding in bindings if isinstance(bindings, list) else ():
        host_port = (
            parse_port(field_str(binding, "HostPort")) if isinstance(binding, Mapping) else None
        )
        if host_port is not None:
            host_ip = field_str(binding, "HostIp")
            return _url("127.0.0.1" if host_ip in _ANY_ADDRESS else host_ip, host_port)
    if field_str(field_obj(inspect, "HostConfig"), "NetworkMode") == "host":
        return _url("127.0.0.1", port)
    ips = [field_str(network, "IPAddress")] + [
        field_str(n, "IPAddress")
        for n in field_obj(network, "Networks").values()
        if isinstance(n, Mapping)
    ]
    ip = next((i for i in ips if i), "")
    return _url(ip, port) if ip else None


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
