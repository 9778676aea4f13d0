"""The Docker / Podman client against a fake Docker daemon on a real unix socket.

No Docker daemon runs here, so tests/discovery/fakedocker.py speaks the Engine API's shapes
(list, inspect, an events stream that ends at ``until``) over a unix socket in a temporary
directory; everything the client does (httpx over the socket, the thread, backoff) is real.
"""

from __future__ import annotations

import itertools
import time

import pytest

from exporter.config import DockerDiscovery
from exporter.discovery.docker import ContainerWatcher
from tests.discovery.containers import (
    CID_COMPOSE,
    CID_PLAIN,
    CID_SGLANG,
    compose_vllm,
    docker_run_sglang,
    podman_vllm,
    unlabelled,
)
from tests.discovery.fakedocker import FakeDocker, container_event
from tests.httpservers import arrivals, hang, reply
from tests.sources.conftest import wait_for


def watcher_for(socket: str, **kwargs: float) -> ContainerWatcher:
    settings = DockerDiscovery(socket=socket)
    watcher = ContainerWatcher(
        settings, **{"events_seconds": 30, "read_seconds": 2.0, "backoff": 0.05, **kwargs}
    )
    watcher.start()
    return watcher


def names(watcher: ContainerWatcher) -> list[str]:
    return [t.target.name for t in watcher.snapshot()]


def test_labelled_containers_are_listed_inspected_and_unlabelled_ones_never_inspected(docker):
    docker.run(compose_vllm(), announce=False)
    docker.run(docker_run_sglang(), announce=False)
    docker.run(unlabelled(), announce=False)
    watcher = watcher_for(docker.socket)
    try:
        wait_for(lambda: names(watcher) == ["serving-llm-1", "sglang"])
        assert watcher.health().up and watcher.health().synced
        assert f"/containers/{CID_PLAIN}/json" not in docker.paths()
        ids = {t.target.container_id for t in watcher.snapshot()}
        assert ids == {CID_COMPOSE, CID_SGLANG}
        assert all(r.method == "GET" for r in docker.http.requests)  # read-only
    finally:
        watcher.close()


def test_events_add_a_started_container_and_drop_a_destroyed_one(docker):
    docker.run(compose_vllm(), announce=False)
    watcher = watcher_for(docker.socket)
    try:
        wait_for(lambda: names(watcher) == ["serving-llm-1"])
        wait_for(lambda: "/events" in docker.paths())
        docker.run(podman_vllm())
        docker.run(unlabelled())  # its event carries no engine label: no inspect follows
        wait_for(lambda: names(watcher) == ["serving-llm-1", "vllm-podman"])
        docker.destroy(CID_COMPOSE)
        wait_for(lambda: names(watcher) == ["vllm-podman"])
        assert f"/containers/{CID_PLAIN}/json" not in docker.paths()
        assert watcher.lists == 1
    finally:
        watcher.close()


def test_an_events_window_ends_and_the_next_resumes_where_it_ended_without_a_list(docker):
    docker.run(compose_vllm(), announce=False)
    watcher = watcher_for(docker.socket, events_seconds=1)
    try:
        wait_for(lambda: docker.paths().count("/events") >= 3, timeout=10)
        assert watcher.lists == 1 and watcher.health().up
        queries = [r.path for r in docker.http.requests if r.path.startswith("/events")]
        assert all("since=" in q and "until=" in q for q in queries)
    finally:
        watcher.close()


def test_a_dropped_stream_reconnects_and_lists_what_happened_meanwhile(docker):
    docker.run(compose_vllm(), announce=False)
    watcher = watcher_for(docker.socket)
    try:
        wait_for(lambda: names(watcher) == ["serving-llm-1"])
        wait_for(lambda: "/events" in docker.paths())
        docker.drop()
        docker.run(docker_run_sglang(), announce=False)  # started while nobody listened
        wait_for(lambda: names(watcher) == ["serving-llm-1", "sglang"])
        assert watcher.lists == 2
        wait_for(lambda: watcher.health().up)
    finally:
        watcher.close()


def test_no_daemon_is_down_with_a_reason_then_up_once_it_starts(socket_path):
    watcher = watcher_for(socket_path)
    try:
        wait_for(lambda: watcher.health().error == "no_socket")
        assert not watcher.health().synced and watcher.snapshot() == ()
        fake = FakeDocker(socket_path)
        try:
            fake.run(docker_run_sglang(), announce=False)
            wait_for(lambda: names(watcher) == ["sglang"], timeout=10)
            assert watcher.health().up
        finally:
            watcher.close()
            fake.close()
    finally:
        watcher.close()


def test_a_container_gone_between_list_and_inspect_is_skipped(docker):
    docker.run(compose_vllm(), announce=False)
    docker.run(docker_run_sglang(), announce=False)
    # Still in the list, yet removed by the time it is inspected: the inspect answers 404.
    docker.http.routes.pop(f"/containers/{CID_SGLANG}/json")
    watcher = watcher_for(docker.socket)
    try:
        wait_for(lambda: names(watcher) == ["serving-llm-1"])
        assert watcher.health().up
    finally:
        watcher.close()


def test_close_ends_an_idle_events_stream_at_once_and_a_hanging_inspect_is_cut(docker):
    docker.run(compose_vllm(), announce=False)
    watcher = watcher_for(docker.socket, read_seconds=1.0)
    try:
        wait_for(lambda: "/events" in docker.paths())
        docker.run(docker_run_sglang(), announce=False)
        docker.http.routes[f"/containers/{CID_SGLANG}/json"] = hang()  # never answers
        docker.events.put(container_event("start", docker_run_sglang()))
        inspect = f"/containers/{CID_SGLANG}/json"
        wait_for(lambda: inspect in docker.paths(), timeout=5)  # now hanging
    finally:
        began = time.monotonic()
        watcher.close()
    assert time.monotonic() - began < 0.9  # cut, not joined after a read timeout


def test_one_hanging_inspect_leaves_the_others_found_and_is_read_once_it_answers(docker):
    docker.run(compose_vllm(), announce=False)
    docker.run(podman_vllm(), announce=False)
    docker.run(docker_run_sglang(), announce=False)
    inspect = f"/containers/{CID_SGLANG}/json"
    answers = docker.http.routes[inspect]
    docker.http.routes[inspect] = hang()  # one container whose inspect never answers
    watcher = watcher_for(docker.socket, events_seconds=1, inspect_seconds=0.5)
    try:
        wait_for(lambda: len(watcher.snapshot()) == 2)
        assert watcher.health().up
        docker.http.routes[inspect] = answers
        wait_for(lambda: len(watcher.snapshot()) == 3)  # tried again before a later window
        assert "sglang" in names(watcher)
    finally:
        watcher.close()


def test_an_events_stream_refused_after_each_good_list_backs_off_growing(docker):
    docker.run(compose_vllm(), announce=False)
    docker.http.routes["/events"] = reply(500, {"message": "events unavailable"})
    lists = arrivals(docker.http, "/containers/json")
    watcher = watcher_for(docker.socket, backoff=0.2, backoff_cap=10.0)
    try:
        wait_for(lambda: len(lists) >= 4, timeout=15)
        gaps = [b - a for a, b in itertools.pairwise(lists)]
        assert gaps[0] == pytest.approx(0.2, abs=0.15)
        assert gaps[2] == pytest.approx(0.8, abs=0.2)  # not reset by the good list between
        wait_for(lambda: watcher.health().error == "daemon_error")
        assert names(watcher) == ["serving-llm-1"]
    finally:
        watcher.close()


def test_an_event_line_past_the_line_cap_is_given_up_and_listed_again(docker):
    docker.run(compose_vllm(), announce=False)

    def endless_line(ex):
        ex.send_head(200, {"Content-Type": "application/json"})
        for _ in range(12):
            if not ex.write(b"x" * (1 << 20)):
                return
        ex.stopping.wait()

    docker.http.routes["/events"] = endless_line
    watcher = watcher_for(docker.socket, read_seconds=30.0)
    try:
        wait_for(lambda: watcher.health().error == "line_too_long")
        assert names(watcher) == ["serving-llm-1"]
    finally:
        watcher.close()


def test_two_replicas_a_template_names_alike_are_one_target_and_one_dropped(docker):
    """``{project}/{service}`` of ``compose up --scale llm=2``: before, they collapsed silently."""
    docker.run(compose_vllm(), announce=False)
    docker.run(compose_vllm(Id="7" * 64, Name="/serving-llm-2"), announce=False)
    settings = DockerDiscovery(socket=docker.socket, name_template="{project}/{service}")
    watcher = ContainerWatcher(settings, events_seconds=30, read_seconds=2.0, backoff=0.05)
    watcher.start()
    try:
        wait_for(lambda: watcher.health().dropped == 1)
        assert names(watcher) == ["serving/llm"]
    finally:
        watcher.close()


def test_containers_past_max_targets_are_left_out_and_counted(docker):
    docker.run(compose_vllm(), announce=False)
    docker.run(docker_run_sglang(), announce=False)
    docker.run(podman_vllm(), announce=False)
    settings = DockerDiscovery(socket=docker.socket, max_targets=2)
    watcher = ContainerWatcher(settings, events_seconds=30, read_seconds=2.0, backoff=0.05)
    watcher.start()
    try:
        wait_for(lambda: watcher.health().dropped == 1)
        assert len(watcher.snapshot()) == 2
    finally:
        watcher.close()
