"""``[discovery.kubernetes]`` and ``[discovery.docker]`` -> their frozen discovery settings."""

from __future__ import annotations

import string
from collections.abc import Mapping

from exporter.config.fields import Table, check_file_path, check_word, read_probe_timeout
from exporter.config.schema import (
    DEFAULT_DOCKER_SOCKET,
    DEFAULT_MAX_TARGETS,
    DOCKER_NAME_PLACEHOLDERS,
    NAME_PLACEHOLDERS,
    UNIQUE_NAME_PLACEHOLDERS,
    DockerDiscovery,
    KubernetesDiscovery,
    PodSelection,
)


def _check_name_template(
    value: str,
    placeholders: tuple[str, ...] = NAME_PLACEHOLDERS,
    unique: tuple[tuple[str, ...], ...] = (UNIQUE_NAME_PLACEHOLDERS,),
) -> str | None:
    """Why ``value`` is no name template, or None.

    Unknown placeholders, a format spec or conversion (``{pod:>30000000}`` pads a name to
    30 MB), or none of the ``unique`` sets that keep two targets apart.
    """
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError as exc:  # an unmatched brace
        return f"is not a template: {exc}"
    for _text, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in placeholders:
            known = ", ".join(f"{{{p}}}" for p in placeholders)
            return f"unknown placeholder {{{name}}}; known: {known}"
        if spec or conversion:
            return f"placeholder {{{name}}} takes no format spec or conversion"
    used = {name for _text, name, _spec, _conv in parsed}
    if not any(all(p in used for p in names) for names in unique):
        needed = " or ".join(" and ".join(f"{{{p}}}" for p in names) for names in unique)
        return f"needs {needed}: without, two targets could get one name"
    return check_word(value)


def read_kubernetes(
    k: Table, interval: float, environ: Mapping[str, str]
) -> KubernetesDiscovery | None:
    """``[discovery.kubernetes]``, or None when disabled or (a problem recorded) unusable."""
    enabled = k.bool_field("enabled", True)
    node_name = k.optional_str("node_name") or environ.get("NODE_NAME", "")
    k.check("node_name", node_name, check_word)
    kubeconfig = k.optional_str("kubeconfig")
    k.check("kubeconfig", kubeconfig, check_file_path)
    template = k.str_field("name_template", "{namespace}/{pod}")
    k.check("name_template", template, _check_name_template)
    select = k.str_field("select", PodSelection.ANNOTATED)
    if select not in set(PodSelection):
        k.fail("select", f"must be one of {', '.join(PodSelection)}")
        select = PodSelection.ANNOTATED
    grace = k.duration("grace", 300.0)
    timeout = read_probe_timeout(k, interval)
    cap = _max_targets(k)
    k.reject_unknown()
    if enabled and not node_name:
        k.fail("node_name", "is required (or set the NODE_NAME environment variable)")
    if not enabled or not node_name:
        return None
    return KubernetesDiscovery(
        node_name=node_name,
        kubeconfig=kubeconfig,
        name_template=template,
        select=PodSelection(select),
        grace_seconds=300.0 if grace is None else grace,
        probe_timeout_seconds=timeout or 0.8,
        max_targets=cap,
    )


def _max_targets(t: Table) -> int:
    """``max_targets``: a positive count of discovered targets."""
    cap = t.int_field("max_targets", DEFAULT_MAX_TARGETS)
    if cap < 1:
        t.fail("max_targets", "must be at least 1")
        return DEFAULT_MAX_TARGETS
    return cap


def _check_docker_template(value: str) -> str | None:
    return _check_name_template(
        value, DOCKER_NAME_PLACEHOLDERS, (("container",), ("project", "service"))
    )


def read_docker(d: Table, interval: float) -> DockerDiscovery | None:
    """``[discovery.docker]``, or None when disabled."""
    enabled = d.bool_field("enabled", True)
    socket = d.str_field("socket", DEFAULT_DOCKER_SOCKET)
    d.check("socket", socket, check_file_path)
    template = d.str_field("name_template", "{container}")
    d.check("name_template", template, _check_docker_template)
    grace = d.duration("grace", 300.0)
    timeout = read_probe_timeout(d, interval)
    cap = _max_targets(d)
    d.reject_unknown()
    if not enabled:
        return None
    return DockerDiscovery(
        socket=socket,
        name_template=template,
        grace_seconds=300.0 if grace is None else grace,
        probe_timeout_seconds=timeout or 0.8,
        max_targets=cap,
    )
