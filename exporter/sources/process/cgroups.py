"""Kubernetes pod UIDs and container IDs from cgroup paths, as /proc/PID/cgroup shows them.

Pure: parses text and directory names handed in; reads no file. cgroup v2 (``0::/path``) and
v1 (one line per hierarchy), the systemd and cgroupfs drivers, containerd, CRI-O, Docker and
Podman.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_HEX64: Final = "[0-9a-f]{64}"
# A container's own directory: a systemd scope of its runtime (kubelet's systemd driver,
# Docker and Podman under systemd), or the bare ID (cgroupfs driver, Docker's /docker/ID,
# CRI-O's crio-ID without the scope). ``libpod-conmon-ID`` and ``crio-conmon-ID`` hold the
# runtime's monitor, not the container: the prefix alternatives leave them out.
_CONTAINER_DIR: Final = re.compile(
    rf"(?:(?:cri-containerd|crio|docker|libpod)-({_HEX64})(?:\.scope)?|({_HEX64}))"
)
_UID: Final = "[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# A pod's directory: ``kubepods-burstable-pod<uid>.slice`` (systemd driver, "-" in the UID
# escaped as "_"), ``kubepods-pod<uid>.slice`` (guaranteed QoS), ``pod<uid>`` (cgroupfs).
_POD_DIR: Final = re.compile(rf"(?:kubepods(?:-[a-z]+)?-)?pod({_UID})(?:\.slice)?")


@dataclass(frozen=True, slots=True)
class CgroupIds:
    """What a cgroup path says about its process: pod UID and container ID, when it says."""

    pod_uid: str | None = None
    container_id: str | None = None


def container_id_of(name: str) -> str | None:
    """The 64-hex container ID a cgroup directory name stands for, or None."""
    m = _CONTAINER_DIR.fullmatch(name)
    return (m.group(1) or m.group(2)) if m else None


def pod_uid_of(name: str) -> str | None:
    """The pod UID (with dashes) a cgroup directory name stands for, or None."""
    m = _POD_DIR.fullmatch(name)
    return m.group(1).replace("_", "-") if m else None


def ids_of_path(path: str) -> CgroupIds:
    """The pod UID and container ID named by one cgroup path; the innermost of each wins.

    A container may nest its own groups (systemd in a container, a delegated subtree), so the
    last container directory on the path is the one the process is in.
    """
    pod: str | None = None
    container: str | None = None
    for name in path.split("/"):
        pod = pod_uid_of(name) or pod
        container = container_id_of(name) or container
    return CgroupIds(pod_uid=pod, container_id=container)


def parse_proc_cgroup(text: str) -> CgroupIds:
    """The pod UID and container ID in the text of /proc/PID/cgroup (v1, v2 or hybrid).

    Every hierarchy of one process names the same container, except those a runtime leaves
    at the root (v1's ``misc``, say): the first line naming a container gives the answer.
    """
    pod: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue  # not a cgroup line
        ids = ids_of_path(parts[2])
        if ids.container_id is not None:
            return ids
        pod = pod or ids.pod_uid
    return CgroupIds(pod_uid=pod)
