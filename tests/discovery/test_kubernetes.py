"""The pod watcher against a fake API server on loopback (see tests/discovery/fakeapi.py for why).

What an operator would notice: the node's annotated pods appear and go as the API server says,
a bookmark or a 410 costs no duplicate or lost pod, a failing or hanging API server shows as
discovery down and is retried with growing pauses, and credentials are what kubectl would use.
"""

from __future__ import annotations

import base64
import copy
import itertools
import tempfile
import time
from pathlib import Path

import pytest

from exporter.base.errors import ConfigError
from exporter.config import KubernetesDiscovery
from exporter.discovery.kubernetes import Credentials, PodWatcher, load_credentials
from tests.discovery.fakeapi import (
    FakeApiServer,
    bookmark,
    bookmarks_forever,
    events,
    expired,
    http_status,
)
from tests.discovery.pods import (
    CID_SGLANG,
    NODE,
    sglang_statefulset_pod,
    two_container_pod,
    vllm_deployment_pod,
)
from tests.httpservers import arrivals, make_tls_files
from tests.sources.conftest import wait_for

pytestmark = pytest.mark.integration
SETTINGS = KubernetesDiscovery(node_name=NODE)


@pytest.fixture
def api():
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def watcher_of():
    made: list[PodWatcher] = []

    def make(credentials: Credentials, **options: float) -> PodWatcher:
        options.setdefault("read_seconds", 2.0)
        watcher = PodWatcher(SETTINGS, credentials, watch_seconds=5, **options)  # type: ignore[arg-type]
        made.append(watcher)
        watcher.start()
        return watcher

    yield make
    for watcher in made:
        watcher.close()


def names(watcher: PodWatcher) -> list[str]:
    return [t.target.name for t in watcher.snapshot()]


def kubeconfig(tmp_path, server: str, *, ca_file: str | None = None, token="t0ken"):
    path = tmp_path / "kubeconfig"
    ca = f"\n    certificate-authority: {ca_file}" if ca_file else ""
    path.write_text(
        f"""apiVersion: v1
kind: Config
current-context: gpu
clusters:
- name: prod
  cluster:
    server: {server}{ca}
contexts:
- name: other
  context: {{cluster: nowhere, user: nobody}}
- name: gpu
  context: {{cluster: prod, user: exporter, namespace: inference}}
users:
- name: exporter
  user:
    token: {token}
"""
    )
    return str(path)


def test_lists_the_nodes_pods_then_follows_watch_events_over_tls_with_a_bearer_token(
    tmp_path, watcher_of
):
    tls = make_tls_files(tmp_path)
    api = FakeApiServer(tls=tls)
    try:
        api.add(vllm_deployment_pod())
        api.add(
            vllm_deployment_pod(
                metadata__uid="other-node-pod",
                metadata__name="elsewhere",
                spec__nodeName="gpu-node-8",
            )
        )
        sglang = sglang_statefulset_pod()
        sglang["metadata"]["resourceVersion"] = "2001"
        gone = copy.deepcopy(sglang)
        gone["metadata"]["resourceVersion"] = "2003"
        api.watches = [
            events(("ADDED", sglang), bookmark("2002"), ("DELETED", gone)),
            events(("ADDED", two_container_pod()), end=False),
        ]
        creds = load_credentials(
            KubernetesDiscovery(
                node_name=NODE, kubeconfig=kubeconfig(tmp_path, api.url, ca_file=tls.ca_file)
            ),
            "c.toml",
        )
        watcher = watcher_of(creds)

        wait_for(
            lambda: (
                names(watcher)
                == ["inference/llama-70b-7d9c5b6f4d-x2k8q", "inference/qwen-5f6d8b9c7-abcde"]
            )
        )
        assert watcher.health().up and watcher.lists == 1
        queries = api.queries()
        assert all(q["fieldSelector"] == f"spec.nodeName={NODE}" for q in queries)
        first, second = queries[1], queries[2]
        assert first["resourceVersion"] == str(api.version)  # from the list
        assert second["resourceVersion"] == "2003"  # the bookmark, then the last event
        assert first["allowWatchBookmarks"] == "true" and first["timeoutSeconds"] == "5"
    finally:
        api.close()


def test_a_pod_added_by_the_watch_has_its_container_id(api, watcher_of):
    api.watches = [events(("ADDED", sglang_statefulset_pod()), end=False)]
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"))
    wait_for(lambda: len(watcher.snapshot()) == 1)
    assert watcher.snapshot()[0].target.container_id == CID_SGLANG


@pytest.mark.parametrize(
    "gone", [events(expired()), http_status(410)], ids=["error-event", "http-410"]
)
def test_410_gone_lists_again_at_once_and_keeps_the_pods(api, watcher_of, gone):
    api.add(vllm_deployment_pod())
    api.watches = [gone]
    started = time.monotonic()
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"), backoff=30.0)

    wait_for(lambda: watcher.lists == 2)
    assert time.monotonic() - started < 10  # no 30 s backoff for a routine expiry
    wait_for(lambda: len(api.queries()) == 4)  # list, watch (410), list, watch
    assert names(watcher) == ["inference/llama-70b-7d9c5b6f4d-x2k8q"]
    assert watcher.health().up


def test_a_failing_api_server_is_reported_down_and_retried_with_growing_pauses(api, watcher_of):
    api.add(vllm_deployment_pod())
    api.list_failures = [500, 503, 500]
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"), backoff=0.2, backoff_cap=0.5)

    wait_for(lambda: watcher.health().error in ("http_500", "http_503"))
    assert not watcher.health().up and watcher.snapshot() == ()
    wait_for(lambda: watcher.health().up, timeout=15)
    assert watcher.lists == 4  # three failures, then the list that worked
    assert names(watcher) == ["inference/llama-70b-7d9c5b6f4d-x2k8q"]


def test_backoff_doubles_up_to_its_cap(api, watcher_of):
    api.list_failures = [500] * 5
    arrivals: list[float] = []
    route = api.http.routes["/api/v1/pods"]

    def timed(ex):
        arrivals.append(time.monotonic())
        route(ex)

    api.http.routes["/api/v1/pods"] = timed
    watcher_of(Credentials(server=api.url, token="t0ken"), backoff=0.2, backoff_cap=0.8)
    wait_for(lambda: len(arrivals) >= 6, timeout=15)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert gaps[0] == pytest.approx(0.2, abs=0.15)
    assert gaps[1] == pytest.approx(0.4, abs=0.15)
    assert gaps[3] == pytest.approx(0.8, abs=0.2) and gaps[4] == pytest.approx(0.8, abs=0.2)


def test_a_watch_that_hangs_is_given_up_at_the_read_deadline_and_listed_again(api, watcher_of):
    api.add(vllm_deployment_pod())
    # no watch steps: every watch is silent after its headers
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"), read_seconds=0.5, backoff=0.1)

    wait_for(lambda: watcher.lists >= 2, timeout=10)
    assert watcher.health().error == "timeout" or watcher.health().up
    assert names(watcher) == ["inference/llama-70b-7d9c5b6f4d-x2k8q"]  # kept while retrying


def test_a_watch_that_breaks_mid_stream_is_retried(api, watcher_of):
    def broken(ex):
        ex.protocol_version = "HTTP/1.1"
        ex.close_connection = True
        ex.send_head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        ex.write(b'40\r\n{"type": "ADDED", "obj')  # the connection drops inside a chunk

    api.add(vllm_deployment_pod())
    api.watches = [broken]
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"), backoff=0.1)
    wait_for(lambda: watcher.lists >= 2)
    assert names(watcher) == ["inference/llama-70b-7d9c5b6f4d-x2k8q"]


def test_in_cluster_the_rotated_token_is_read_for_each_request(tmp_path, watcher_of):
    tls = make_tls_files(tmp_path)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("first-token\n")
    (account / "ca.crt").write_bytes(Path(tls.ca_file).read_bytes())
    api = FakeApiServer(tls=tls, token=lambda: (account / "token").read_text().strip())
    try:
        api.add(vllm_deployment_pod())
        env = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api.http.port),
        }
        creds = load_credentials(SETTINGS, "c.toml", environ=env, service_account_dir=str(account))
        assert "first-token" not in repr(creds)
        # silent watches end at the read deadline: a new request every half second
        watcher = watcher_of(creds, backoff=0.1, read_seconds=0.5)
        wait_for(lambda: len(watcher.snapshot()) == 1)
        (account / "token").write_text("rotated-token\n")  # the kubelet refreshes it hourly
        seen = len(api.http.requests)
        wait_for(
            lambda: any(
                r.headers.get("authorization") == "Bearer rotated-token"
                for r in api.http.requests[seen:]
            )
        )
        assert watcher.snapshot() and len(watcher.snapshot()) == 1
    finally:
        api.close()


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ("apiVersion: v1\nkind: Config\n", "has no current-context with a cluster"),
        (
            "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {server: ftp://x}}]\n",
            "current context's cluster has no http(s) server",
        ),
        ("[unclosed", "is not YAML"),
    ],
)
def test_kubeconfig_problems_are_one_line_naming_the_key(tmp_path, config, reason):
    path = tmp_path / "kubeconfig"
    path.write_text(config)
    with pytest.raises(ConfigError) as info:
        load_credentials(KubernetesDiscovery(node_name=NODE, kubeconfig=str(path)), "c.toml")
    assert str(info.value) == f"c.toml: discovery.kubernetes.kubeconfig: {reason}"


def test_outside_a_cluster_without_a_kubeconfig_says_what_is_missing(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_credentials(SETTINGS, "c.toml", environ={}, service_account_dir=str(tmp_path))
    assert str(info.value) == (
        "c.toml: discovery.kubernetes.kubeconfig: is required outside a cluster "
        "(KUBERNETES_SERVICE_HOST unset)"
    )


def test_a_watch_that_never_ends_is_cut_at_its_deadline_and_resumed_by_a_list(api, watcher_of):
    api.add(vllm_deployment_pod())
    api.watches = [bookmarks_forever(0.1)]
    watcher = PodWatcher(
        SETTINGS,
        Credentials(server=api.url, token="t0ken"),
        watch_seconds=1,
        read_seconds=0.5,
        backoff=0.1,
    )
    watcher.start()
    try:
        started = time.monotonic()
        wait_for(lambda: watcher.lists >= 2, timeout=10)
        assert 1.4 < time.monotonic() - started < 5  # timeoutSeconds + one read, then a list
        assert names(watcher) == ["inference/llama-70b-7d9c5b6f4d-x2k8q"]
    finally:
        watcher.close()


def test_closing_during_a_silent_watch_returns_at_once(api):
    watcher = PodWatcher(SETTINGS, Credentials(server=api.url, token="t0ken"), read_seconds=30)
    watcher.start()
    wait_for(lambda: len(api.queries()) == 2)  # list, then the watch that stays silent
    started = time.monotonic()
    watcher.close()
    assert time.monotonic() - started < 2


def test_a_kubeconfig_with_client_certificate_data_and_a_token_file(tmp_path, monkeypatch):
    tls = make_tls_files(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where ssl's key file goes

    def b64(path: str) -> str:
        return base64.b64encode(Path(path).read_bytes()).decode()

    (tmp_path / "token").write_text("from-file\n")
    path = tmp_path / "kubeconfig"
    path.write_text(
        "current-context: c\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        f"clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:6443', "
        f"certificate-authority-data: {b64(tls.ca_file)}}}}}]\n"
        f"users: [{{name: u, user: {{client-certificate-data: {b64(tls.cert_file)}, "
        f"client-key-data: {b64(tls.key_file)}, tokenFile: token}}}}]\n"
    )
    creds = load_credentials(KubernetesDiscovery(node_name=NODE, kubeconfig=str(path)), "c.toml")
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.ssl_context is not None
    assert creds.headers() == {"Authorization": "Bearer from-file"}  # relative to the file
    assert list(scratch.iterdir()) == []  # the key went through a directory since removed


def test_a_client_key_that_does_not_match_is_refused_in_one_line(tmp_path):
    (tmp_path / "other").mkdir()
    tls, other = make_tls_files(tmp_path), make_tls_files(tmp_path / "other")
    path = tmp_path / "kubeconfig"
    path.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        f"users: [{{name: u, user: {{client-certificate: {tls.cert_file}, "
        f"client-key: {other.key_file}}}}}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_credentials(KubernetesDiscovery(node_name=NODE, kubeconfig=str(path)), "c.toml")
    assert (
        str(info.value) == "c.toml: discovery.kubernetes.kubeconfig: TLS files unusable: SSLError"
    )


def arrivals_of(api: FakeApiServer) -> list[float]:
    """When each list (not watch) request arrived, from now on."""
    return arrivals(api.http, "/api/v1/pods", lambda ex: "watch=1" not in ex.path)


def test_a_watch_answering_410_to_every_list_backs_off_and_reports_down(api, watcher_of):
    """Each list is fresh, yet every watch from it is Gone: one relist at once, then backoff."""
    api.add(vllm_deployment_pod())
    api.watches = [http_status(410)] * 1000
    arrivals = arrivals_of(api)
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"), backoff=0.5, backoff_cap=10.0)

    wait_for(lambda: watcher.health().error == "relist_loop")
    wait_for(lambda: len(arrivals) >= 5, timeout=15)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert gaps[0] < 0.4  # the first 410 lists again at once, as a routine expiry does
    assert gaps[1] == pytest.approx(0.5, abs=0.3)
    assert gaps[3] == pytest.approx(2.0, abs=0.4)  # doubled though every list succeeded
    assert names(watcher) == ["inference/llama-70b-7d9c5b6f4d-x2k8q"]


def test_a_watch_failing_at_once_after_each_good_list_backs_off_growing(api, watcher_of):
    api.add(vllm_deployment_pod())
    api.watches = [http_status(500)] * 1000
    arrivals = arrivals_of(api)
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"), backoff=0.2, backoff_cap=10.0)

    wait_for(lambda: len(arrivals) >= 4, timeout=15)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert gaps[0] == pytest.approx(0.2, abs=0.15)
    assert gaps[2] == pytest.approx(0.8, abs=0.2)  # not reset by the good list between
    wait_for(lambda: watcher.health().error == "http_500")


def endless_line(ex) -> None:
    """A watch whose one event never ends: megabytes without a newline, then silence."""
    ex.protocol_version = "HTTP/1.1"
    ex.close_connection = True
    ex.send_head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    piece = b"x" * (1 << 20)
    for _ in range(12):
        if not ex.write(b"%x\r\n%s\r\n" % (len(piece), piece)):
            return
    ex.stopping.wait()


def test_a_watch_line_past_the_line_cap_is_given_up_and_listed_again(api, watcher_of):
    api.add(vllm_deployment_pod())
    api.watches = [endless_line]
    watcher = watcher_of(Credentials(server=api.url, token="t0ken"), backoff=0.1, read_seconds=30)

    wait_for(lambda: watcher.health().error == "line_too_long")
    wait_for(lambda: watcher.lists >= 2)
    assert names(watcher) == ["inference/llama-70b-7d9c5b6f4d-x2k8q"]
