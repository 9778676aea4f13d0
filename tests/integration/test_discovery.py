"""Discovery end to end: only ``[discovery.kubernetes]`` (or ``[discovery.docker]``), engines in
real cgroups, the real exporter process following them to ready and past their deletion.

The API server is the loopback fake (tests/discovery/fakeapi.py: no kube-apiserver runs
here); everything else is real: the exporter (``run``), simulated engines placed in cgroups
this test creates under the host's cgroup2 mount as the kubelet's systemd driver lays them out.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.cgroupfs import cgroup_hierarchies
from tests.discovery.containers import docker_run_sglang, unlabelled
from tests.discovery.fakeapi import FakeApiServer, events, expired, follow
from tests.discovery.fakedocker import FakeDocker
from tests.discovery.pods import NODE, vllm_deployment_pod
from tests.discovery.test_kubernetes import kubeconfig
from tests.integration.harness import exporter, simulator

pytestmark = pytest.mark.integration
CGROUP2 = next((h for h in cgroup_hierarchies() if os.path.ismount(h)), None)
INTERVAL = 0.25


def cgroup2_problem() -> str | None:
    """Why real container cgroups cannot be made here, or None."""
    if CGROUP2 is None or not CGROUP2.startswith("/sys/fs/cgroup"):
        return "no cgroup2 hierarchy under /sys/fs/cgroup"
    if not os.access(CGROUP2, os.W_OK):
        return f"{CGROUP2} is read-only"
    return None


def engine_pod(name: str, sim_port: int, *, node: str = NODE) -> tuple[dict, str, str]:
    """An SGLang Deployment replica on ``node`` probed on loopback; returns it, its UID and
    its container ID."""
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    pod = vllm_deployment_pod(
        metadata__name=name,
        metadata__uid=uid,
        metadata__annotations={
            "inference-lifecycle.io/engine": "sglang",
            "inference-lifecycle.io/port": str(sim_port),
        },
        spec__nodeName=node,
        status__podIP="127.0.0.1",
    )
    pod["status"]["containerStatuses"][0]["containerID"] = f"containerd://{cid}"
    return pod, uid, cid


def container_cgroup(make, uid: str, cid: str) -> Path:
    pod_slice = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    return make(
        Path(CGROUP2, "kubepods.slice", "kubepods-burstable.slice", pod_slice)
        / f"cri-containerd-{cid}.scope"
    )


def start_in(sim, group: Path) -> None:
    """Launch the simulator as its container's first process: it joins the cgroup, then execs."""
    sim.command = [
        "sh",
        "-c",
        'echo $$ > "$0" && exec "$@"',
        str(group / "cgroup.procs"),
        *sim.command,
    ]
    sim.launch()


def drop_connection(ex) -> None:
    """Close the connection without an answer (a restarting API server, a proxy's reset)."""


def test_two_pods_of_the_node_are_followed_to_ready_and_a_deleted_one_goes_after_grace(
    tmp_path, cgroup_dir
):
    if problem := cgroup2_problem():
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    api = FakeApiServer()
    with (
        simulator(tmp_path, launch=False) as sim_a,
        simulator(tmp_path, launch=False) as sim_b,
    ):
        pod_a, uid_a, cid_a = engine_pod("llama-70b-7d9c5b6f4d-aaaaa", sim_a.port)
        pod_b, uid_b, cid_b = engine_pod("llama-70b-7d9c5b6f4d-bbbbb", sim_b.port)
        other, _, _ = engine_pod("llama-70b-7d9c5b6f4d-ccccc", sim_a.port, node="gpu-node-8")
        for pod in (pod_a, pod_b, other):
            api.add(pod)
        # A 410 at once, then a watch whose connection drops unanswered, then the live one.
        api.watches = [events(expired()), drop_connection, follow(api)]
        config = (
            f'[discovery.kubernetes]\nnode_name = "{NODE}"\n'
            f'kubeconfig = "{kubeconfig(tmp_path, api.url)}"\ngrace = "3s"\n'
            f'probe_timeout = "{INTERVAL * 0.8}s"\n'
        )
        try:
            with exporter(tmp_path, config, interval=INTERVAL) as exp:
                name_a, name_b = (f"inference/{p['metadata']['name']}" for p in (pod_a, pod_b))
                exp.wait_for(lambda t: t["phase"] == "down", name_a)
                start_in(sim_a, container_cgroup(cgroup_dir, uid_a, cid_a))
                start_in(sim_b, container_cgroup(cgroup_dir, uid_b, cid_b))
                for name in (name_a, name_b):
                    doc = exp.wait_for(lambda t: t["phase"] in ("ready", "serving"), name)
                    assert doc["process"]["processes"] >= 2  # main + worker, by cgroup
                relists = [q for q in api.queries() if "watch" not in q]
                assert len(relists) >= 3  # the first, after the 410, after the dropped watch
                names = {t["target"] for t in exp.status()["targets"]}
                assert names == {name_a, name_b}  # the other node's pod is not ours
                assert 'inference_exporter_source_up{source="kubernetes",target=""} 1.0' in (
                    exp.metrics()
                )

                api.delete(uid_a)
                deleted_at = time.monotonic()
                exp.wait_for(lambda t: True, name_a)  # still exported during the grace
                while name_a in {t["target"] for t in exp.status()["targets"]}:
                    assert time.monotonic() - deleted_at < 20, "never dropped"
                    time.sleep(0.1)
                assert time.monotonic() - deleted_at >= 2.5  # grace = 3s

                # The API server now hangs on every list: the daemon ticks on, B stays.
                api.lists_hang.set()
                api.live.put(expired())
                before = exp.status()["taken_at"]
                time.sleep(1.5)
                doc = exp.target(name_b)
                assert doc["phase"] in ("ready", "serving")
                assert exp.status()["taken_at"] > before + 1
        finally:
            api.close()


def test_two_labelled_containers_are_followed_to_ready_and_a_destroyed_one_goes_after_grace(
    tmp_path, cgroup_dir
):
    """The same for a Docker host: only ``[discovery.docker]``, the fake Engine API socket.

    No Docker daemon runs here (tests/discovery/fakedocker.py speaks its API on a unix
    socket); the engines run in real cgroups laid out as Docker's systemd driver
    (``system.slice/docker-<id>.scope``) and its cgroupfs driver (``/docker/<id>``) make them.
    """
    if problem := cgroup2_problem():
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    sockets = tempfile.mkdtemp(prefix="dock", dir="/tmp")  # a socket path holds 108 bytes
    docker = FakeDocker(str(Path(sockets, "docker.sock")))
    with (
        simulator(tmp_path, launch=False) as sim_a,
        simulator(tmp_path, launch=False) as sim_b,
    ):
        cid_a, cid_b = (uuid.uuid4().hex + uuid.uuid4().hex for _ in range(2))
        published = {"HostIp": "0.0.0.0"}
        a = docker_run_sglang(
            Id=cid_a,
            Name="/sglang-a",
            NetworkSettings__Ports={"30000/tcp": [{**published, "HostPort": str(sim_a.port)}]},
        )
        b = docker_run_sglang(
            Id=cid_b,
            Name="/sglang-b",
            NetworkSettings__Ports={"30000/tcp": [{**published, "HostPort": str(sim_b.port)}]},
        )
        for container in (a, b, unlabelled()):
            docker.run(container, announce=False)
        config = (
            f'[discovery.docker]\nsocket = "{docker.socket}"\ngrace = "3s"\n'
            f'probe_timeout = "{INTERVAL * 0.8}s"\n'
        )
        try:
            with exporter(tmp_path, config, interval=INTERVAL) as exp:
                exp.wait_for(lambda t: t["phase"] == "down", "sglang-a")
                start_in(sim_a, cgroup_dir(Path(CGROUP2, "system.slice", f"docker-{cid_a}.scope")))
                start_in(sim_b, cgroup_dir(Path(CGROUP2, "docker", cid_b)))
                for name in ("sglang-a", "sglang-b"):
                    doc = exp.wait_for(lambda t: t["phase"] in ("ready", "serving"), name)
                    assert doc["process"]["processes"] >= 2  # main + worker, by cgroup
                assert {t["target"] for t in exp.status()["targets"]} == {"sglang-a", "sglang-b"}
                metrics = exp.metrics()
                assert 'inference_exporter_source_up{source="docker",target=""} 1.0' in metrics
                assert cid_a not in metrics and cid_b not in metrics  # IDs are never labels

                docker.drop()  # the events stream breaks; the next list still has both
                docker.destroy(cid_a)
                destroyed_at = time.monotonic()
                exp.wait_for(lambda t: True, "sglang-a")  # still exported during the grace
                while "sglang-a" in {t["target"] for t in exp.status()["targets"]}:
                    assert time.monotonic() - destroyed_at < 20, "never dropped"
                    time.sleep(0.1)
                assert time.monotonic() - destroyed_at >= 2.5  # grace = 3s
                assert exp.target("sglang-b")["phase"] in ("ready", "serving")
        finally:
            docker.close()
            shutil.rmtree(sockets, ignore_errors=True)
