"""Kubernetes pod objects -> targets: which containers, their names, probes and history keys.

Pure: takes a pod as the API server's JSON (already parsed) and the discovery settings; no
I/O, no clock. A pod with nothing to watch (no annotation, no IP yet, gone) gives no target.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from exporter.config import (
    CompletionProbe,
    KubernetesDiscovery,
    PodRef,
    PodSelection,
    Target,
)
from exporter.engines import ENGINES, Engine

#: Annotation (or label) prefix; ``<prefix>engine`` selects a pod.
PREFIX: Final = "inference-lifecycle.io/"
_RUNTIME_PREFIX: Final = re.compile(r"^(?:containerd|cri-o|docker)://")
_LWS: Final = "leaderworkerset.sigs.k8s.io/"
_GONE_PHASES: Final = frozenset({"Succeeded", "Failed"})
# Annotations are anyone's free text: a path and a label value must stay one printable line.
_PRINTABLE: Final = re.compile(r"[^\x00-\x1f\x7f-\x9f]{0,256}")
_PATH: Final = re.compile(r"/[!-~]{0,255}")


@dataclass(frozen=True, slots=True)
class DiscoveredTarget:
    """A target found on the API server, with the UID of the pod it belongs to.

    ``target.pod`` (namespace, pod, container) is for ``inference_server_info`` only; the pod
    IP and command line never leave ``target.base_url`` and the process finder.
    """

    target: Target
    pod_uid: str

    @property
    def where(self) -> PodRef:
        """Namespace, pod and container of the target."""
        return self.target.pod or PodRef("", "", "")  # always set by targets_from_pod


def targets_from_pod(
    pod: Mapping[str, object], settings: KubernetesDiscovery
) -> list[DiscoveredTarget]:
    """One target per selected container of ``pod``; none when it has nothing to watch.

    Nothing to watch: a pod being deleted or finished (``Succeeded``/``Failed``: the daemon
    keeps exporting its last state for the grace period), and a pod without an IP yet (no
    sandbox, so no container has started; the kubelet reports the IP before the first
    container runs, so no cold start is missed). A selected container not created yet has
    ``container_id`` ``""``: its process is found once the runtime reports its ID.
    """
    meta, spec, status = (
        field_obj(pod, "metadata"),
        field_obj(pod, "spec"),
        field_obj(pod, "status"),
    )
    pod_ip = field_str(status, "podIP")
    if "deletionTimestamp" in meta or field_str(status, "phase") in _GONE_PHASES or not pod_ip:
        return []
    containers = [c for c in field_objs(spec, "containers") if field_str(c, "name")]
    chosen = _select(meta, containers, settings.select)
    ids = {
        field_str(s, "name"): _RUNTIME_PREFIX.sub("", field_str(s, "containerID"))
        for s in field_objs(status, "containerStatuses")
    }
    template = settings.name_template
    if len(chosen) > 1 and "{container}" not in template:
        template += "/{container}"
    found = []
    for container, engine in chosen:
        port = _port(meta, container)
        if port is None:
            continue  # nothing to probe: an annotation must say which port
        name = field_str(container, "name")
        found.append(
            _discovered(
                meta, pod_ip, port, container, engine, template, ids.get(name, ""), settings
            )
        )
    return found


def _discovered(
    meta: Mapping[str, object],
    pod_ip: str,
    port: int,
    container: Mapping[str, object],
    engine: Engine,
    template: str,
    container_id: str,
    settings: KubernetesDiscovery,
) -> DiscoveredTarget:
    namespace, pod, name = (
        field_str(meta, "namespace"),
        field_str(meta, "name"),
        field_str(container, "name"),
    )
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    target = labelled_target(
        lambda key: _meta_value(meta, key),
        name=template.format(namespace=namespace, pod=pod, container=name),
        engine=engine,
        base_url=f"http://{host}:{port}",
        container_id=container_id,
        history_key=f"{namespace}/{_owner(meta)}/{name}",
        pod=PodRef(namespace, pod, name),
        probe_timeout_seconds=settings.probe_timeout_seconds,
    )
    return DiscoveredTarget(target, field_str(meta, "uid"))


def labelled_target(
    value: Callable[[str], str],
    *,
    name: str,
    engine: Engine,
    base_url: str,
    container_id: str,
    history_key: str,
    pod: PodRef,
    probe_timeout_seconds: float,
) -> Target:
    """A target whose probe settings come from ``inference-lifecycle.io/*`` metadata.

    ``value(key)`` reads ``inference-lifecycle.io/<key>`` ("" when absent) from a pod's
    annotations or a container's labels: Kubernetes and Docker share the keys.
    """
    model = value("completion-model")
    model = model if _PRINTABLE.fullmatch(model) else ""  # a label value: one line
    health_path, model_path = value("health-path"), value("model-path")
    return Target(
        name=name,
        engine=engine.name,
        base_url=base_url,
        health_path=health_path if _PATH.fullmatch(health_path) else engine.health_path,
        probe_timeout_seconds=probe_timeout_seconds,
        completion=CompletionProbe(model=model) if model else None,
        container_id=container_id,
        model_path=model_path if _PATH.fullmatch(model_path) else None,
        model=model,
        history_key=history_key,
        pod=pod,
    )


def parse_port(text: str) -> int | None:
    """A TCP port from metadata text; None unless it is a number in 1..65535."""
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def _select(
    meta: Mapping[str, object],
    containers: Sequence[Mapping[str, object]],
    select: PodSelection,
) -> list[tuple[Mapping[str, object], Engine]]:
    """The containers to watch and their engines: the annotated one, or those named by image."""
    engine_name = _meta_value(meta, "engine")
    if engine_name:
        engine = ENGINES.get(engine_name)
        wanted = _meta_value(meta, "container") or (
            field_str(containers[0], "name") if containers else ""
        )
        chosen = [c for c in containers if field_str(c, "name") == wanted]
        return [(chosen[0], engine)] if engine is not None and chosen else []
    if select is not PodSelection.ANNOTATED_OR_IMAGE:
        return []
    return [(c, e) for c in containers if (e := _engine_of_image(c)) is not None]


def _engine_of_image(container: Mapping[str, object]) -> Engine | None:
    """The engine whose server words the image or command line names (first in ``ENGINES``)."""
    words = [field_str(container, "image")]
    for key in ("command", "args"):
        value = container.get(key)
        if isinstance(value, list):
            words.extend(w for w in value if isinstance(w, str))
    text = " ".join(words)
    for engine in ENGINES.values():
        if engine.process_words and re.search(engine.process_words, text):
            return engine
    return None


def _port(meta: Mapping[str, object], container: Mapping[str, object]) -> int | None:
    """The annotated port, else the container's port named ``http``, else its first one."""
    annotated = _meta_value(meta, "port")
    if annotated:
        return parse_port(annotated)
    ports = [p for p in field_objs(container, "ports") if isinstance(p.get("containerPort"), int)]
    named = [p for p in ports if p.get("name") == "http"] or ports
    port = named[0]["containerPort"] if named else None
    return port if isinstance(port, int) else None


def _owner(meta: Mapping[str, object]) -> str:
    """The workload a pod is a replica of, as ``Kind/name``; the pod itself when none.

    A Deployment's pods are owned by a ReplicaSet named ``<deployment>-<pod-template-hash>``:
    a new template makes a new ReplicaSet, yet it is the same server, so the hash goes.
    A LeaderWorkerSet's leaders and workers start differently: each role keeps its own.
    """
    labels = field_obj(meta, "labels")
    if lws := field_str(labels, _LWS + "name"):
        role = "leader" if field_str(labels, _LWS + "worker-index") in ("", "0") else "worker"
        return f"LeaderWorkerSet/{lws}/{role}"
    for ref in field_objs(meta, "ownerReferences"):
        if ref.get("controller") is not True:
            continue
        kind, name = field_str(ref, "kind"), field_str(ref, "name")
        template_hash = field_str(labels, "pod-template-hash")
        if kind == "ReplicaSet" and template_hash and name.endswith("-" + template_hash):
            return f"Deployment/{name.removesuffix('-' + template_hash)}"
        return f"{kind}/{name}"
    return f"Pod/{field_str(meta, 'name')}"


def _meta_value(meta: Mapping[str, object], key: str) -> str:
    """``inference-lifecycle.io/<key>`` from the annotations, else the labels; "" when absent."""
    return field_str(field_obj(meta, "annotations"), PREFIX + key) or field_str(
        field_obj(meta, "labels"), PREFIX + key
    )


def field_obj(parent: Mapping[str, object], key: str) -> Mapping[str, object]:
    """The object under ``key`` of a JSON object; empty when absent or not an object."""
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def field_objs(parent: Mapping[str, object], key: str) -> list[Mapping[str, object]]:
    """The objects in the list under ``key``; anything else in it is skipped."""
    value = parent.get(key)
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def field_str(parent: Mapping[str, object], key: str) -> str:
    """The string under ``key``; "" when absent or not a string."""
    value = parent.get(key)
    return value if isinstance(value, str) else ""
