"""Pod UIDs and container IDs out of /proc/PID/cgroup, one real-shaped line per runtime layout."""

from __future__ import annotations

import pytest

from exporter.sources.process.cgroups import CgroupIds, ids_of_path, parse_proc_cgroup

CID = "3b4f6c1d2e8a9f0b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b"
UID = "8d2f4a6e-1b3c-4d5e-9f70-a1b2c3d4e5f6"
SYSTEMD_UID = UID.replace("-", "_")

# (layout, /proc/PID/cgroup text, expected pod UID, expected container ID)
LINES = [
    (
        "containerd, systemd driver, v2",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "CRI-O, systemd driver, v2, best effort",
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{SYSTEMD_UID}.slice/crio-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "cri-dockerd, systemd driver, guaranteed QoS",
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "containerd, cgroupfs driver, v2",
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        UID,
        CID,
    ),
    (
        "cgroupfs driver, guaranteed QoS, v2",
        f"0::/kubepods/pod{UID}/{CID}\n",
        UID,
        CID,
    ),
    (
        "cgroupfs driver, v1: one line per hierarchy, some at the root",
        f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n"
        "11:misc:/\n"
        f"10:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"4:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n",
        UID,
        CID,
    ),
    (
        "systemd driver, hybrid v1 + v2",
        f"13:memory:/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n"
        f"1:name=systemd:/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n"
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "plain Docker, cgroupfs, v1",
        f"9:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
        None,
        CID,
    ),
    ("plain Docker, systemd, v2", f"0::/system.slice/docker-{CID}.scope\n", None, CID),
    ("Podman, root", f"0::/machine.slice/libpod-{CID}.scope/container\n", None, CID),
    (
        "Podman, rootless",
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope\n",
        None,
        CID,
    ),
]

NOT_A_CONTAINER = [
    ("a systemd service", "0::/system.slice/vllm.service\n", None),
    ("a login session", "0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("Podman's monitor, not the container", f"0::/machine.slice/libpod-conmon-{CID}.scope\n", None),
    ("CRI-O's monitor", f"0::/kubepods.slice/crio-conmon-{CID}.scope\n", None),
    ("inside a cgroup namespace", "0::/\n", None),
    ("a pod's own slice: its UID but no container", f"0::/kubepods/burstable/pod{UID}\n", UID),
    ("a short hex name is not an ID", "0::/docker/3b4f6c1d2e8a\n", None),
    ("uppercase hex is not what runtimes write", f"0::/docker/{CID.upper()}\n", None),
    ("not cgroup text", "hello\n\n", None),
]


@pytest.mark.parametrize(
    ("text", "pod", "container"), [c[1:] for c in LINES], ids=[c[0] for c in LINES]
)
def test_each_runtime_layout_names_its_pod_and_container(text, pod, container):
    assert parse_proc_cgroup(text) == CgroupIds(pod_uid=pod, container_id=container)


@pytest.mark.parametrize(
    ("text", "pod"), [c[1:] for c in NOT_A_CONTAINER], ids=[c[0] for c in NOT_A_CONTAINER]
)
def test_paths_that_are_not_a_container_name_none(text, pod):
    assert parse_proc_cgroup(text) == CgroupIds(pod_uid=pod, container_id=None)


def test_the_innermost_container_on_a_path_is_the_process_own():
    outer, inner = CID, CID[::-1]
    path = f"/system.slice/docker-{outer}.scope/kubepods/pod{UID}/{inner}"  # kind, k3d
    assert ids_of_path(path) == CgroupIds(pod_uid=UID, container_id=inner)
