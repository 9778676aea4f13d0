"""Discovery against a misbehaving API server, end to end: the real exporter process.

The API server is the loopback fake (tests/discovery/fakeapi.py: no kube-apiserver runs
here); the exporter is the real ``run``, so what is measured is what an operator would see:
its requests to the API server, ``/metrics`` and its log.
"""

from __future__ import annotations

import time

import pytest

from exporter.config.schema import DEFAULT_MAX_TARGETS
from tests.discovery.fakeapi import FakeApiServer, follow, http_status
from tests.discovery.pods import NODE, vllm_deployment_pod
from tests.discovery.test_kubernetes import endless_line, kubeconfig
from tests.httpservers import closed_port
from tests.integration.harness import exporter

pytestmark = pytest.mark.integration
POD = "inference/llama-70b-7d9c5b6f4d-x2k8q"
DOWN = 'inference_exporter_source_up{source="kubernetes",target=""} 0.0'


def kubernetes_toml(tmp_path, api: FakeApiServer) -> str:
    return (
        f'[discovery.kubernetes]\nnode_name = "{NODE}"\n'
        f'kubeconfig = "{kubeconfig(tmp_path, api.url)}"\nprobe_timeout = "0.2s"\n'
    )


def lists_of(api: FakeApiServer) -> int:
    return sum("watch" not in q for q in api.queries())


def test_a_watch_gone_after_every_list_backs_off_and_shows_discovery_down(tmp_path):
    """Before: 306 list+watch pairs a second, ``source_up`` 1. Now: a handful, and down."""
    api = FakeApiServer()
    api.add(vllm_deployment_pod())
    api.watches = [http_status(410)] * 100_000
    try:
        with exporter(tmp_path, kubernetes_toml(tmp_path, api)) as exp:
            exp.wait_for(lambda t: True, POD, timeout=20)
            began, listed = time.monotonic(), lists_of(api)
            deadline = began + 20
            while DOWN not in exp.metrics():
                assert time.monotonic() < deadline, "discovery never reported down"
                time.sleep(0.1)
            time.sleep(max(0.0, 4 - (time.monotonic() - began)))
            assert lists_of(api) - listed <= 5  # 1 s, 2 s, 4 s apart: at most 3 in 4 s
            assert "kubernetes discovery down reason=relist_loop" in exp.log_text()
            assert POD in {t["target"] for t in exp.status()["targets"]}  # kept meanwhile
    finally:
        api.close()


def test_a_watch_event_that_never_ends_is_cut_at_the_line_cap(tmp_path):
    """Before: a 60 MiB line without a newline pinned a core for 40 s. Now: cut at 4 MiB."""
    api = FakeApiServer()
    api.add(vllm_deployment_pod())
    api.watches = [endless_line]
    try:
        with exporter(tmp_path, kubernetes_toml(tmp_path, api)) as exp:
            exp.wait_for(lambda t: True, POD, timeout=20)
            deadline = time.monotonic() + 20
            while "reason=line_too_long" not in exp.log_text():
                assert time.monotonic() < deadline, exp.log_text()
                time.sleep(0.1)
            assert POD in {t["target"] for t in exp.status()["targets"]}
    finally:
        api.close()


def test_more_pods_than_max_targets_are_capped_counted_and_logged_once(tmp_path):
    """Before: every pod became a target (5,000: a 7.5 s scrape, 253 MiB, 41k log lines)."""
    api = FakeApiServer()
    for i in range(DEFAULT_MAX_TARGETS + 36):
        api.add(
            vllm_deployment_pod(
                metadata__name=f"llm-{i:03d}",
                metadata__uid=f"uid-{i:03d}",
                metadata__annotations={
                    "inference-lifecycle.io/engine": "vllm",
                    "inference-lifecycle.io/port": str(closed_port()),
                },
                status__podIP="127.0.0.1",
            )
        )
    api.watches = [follow(api)]
    try:
        with exporter(tmp_path, kubernetes_toml(tmp_path, api)) as exp:
            dropped = 'inference_exporter_discovery_dropped_targets{source="kubernetes"} 36.0'
            deadline = time.monotonic() + 30
            while dropped not in exp.metrics():
                assert time.monotonic() < deadline, exp.metrics()[-3000:]
                time.sleep(0.2)
            wanted = {f"inference/llm-{i:03d}" for i in range(DEFAULT_MAX_TARGETS)}
            while {t["target"] for t in exp.status()["targets"]} != wanted:
                assert time.monotonic() < deadline, exp.log_text()[-3000:]
                time.sleep(0.2)
            api.delete("uid-000")  # one less found: still over the cap, no new line
            deadline = time.monotonic() + 30
            while dropped.replace("36.0", "35.0") not in exp.metrics():
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert exp.log_text().count("left targets out") == 1
    finally:
        api.close()
