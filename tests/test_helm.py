"""The Helm chart (deploy/helm/inference-lifecycle-exporter), rendered the way Helm renders it.

No helm binary installs from this project's registries, so tools/helm-render is built here from
Helm's own parts (Go's text/template, Debian's sprig, YAML through JSON, gojsonschema for
values.schema.json) and renders the chart as `helm template` would. Every rendered document
then meets the checks tests/test_deploy.py applies to deploy/kubernetes: the Kubernetes
schemas (strict) for core kinds, the prometheus-operator slice for the CRDs, and the real
exporter's `check-config` for the config the ConfigMap carries.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter import __version__
from exporter.config import parse_settings
from tests.httpservers import make_tls_files
from tests.integration.kubelet import manifest_in
from tests.test_deploy import CRD_SCHEMAS, K8S_VERSIONS, check_config, manifests

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy/helm/inference-lifecycle-exporter"
RENDERER = ROOT / "tools/helm-render"
NAME = "ile-inference-lifecycle-exporter"  # release "ile": the chart's full name
APP_NAME = "inference-lifecycle-exporter"
MOUNTED_CONFIG = "/etc/inference-lifecycle-exporter/config.toml"


@pytest.fixture(scope="session")
def helm_render(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tools/helm-render, built once in GOPATH mode against Debian's Go packages."""
    go = shutil.which("go")
    assert go, (
        "go missing: run tools/install-system-packages.sh test "
        "(golang-go and Debian's sprig, yaml and gojsonschema packages)"
    )
    out = tmp_path_factory.mktemp("helm-render") / "helm-render"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": "/usr/share/gocode", "CGO_ENABLED": "0"}
    if not (env.get("GOCACHE") or env.get("XDG_CACHE_HOME") or env.get("HOME")):
        env["GOCACHE"] = str(out.parent / "cache")
    built = subprocess.run(
        [go, "build", "-o", str(out), "."],
        cwd=RENDERER,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return out


def helm(binary: Path, *args: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
    """`helm template ile CHART -n monitoring ARGS`, through the renderer."""
    return subprocess.run(
        [str(binary), "--name", "ile", "-n", "monitoring", *args, str(chart)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def render(binary: Path, *args: str) -> list[dict[str, Any]]:
    """The rendered documents; the render must succeed."""
    result = helm(binary, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("---\n# Source: inference-lifecycle-exporter/templates/")
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        assert doc["kind"] not in out, f"two {doc['kind']} documents"
        out[doc["kind"]] = doc
    return out


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(docs)["DaemonSet"]["spec"]["template"]["spec"]
    return spec


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = pod_spec(docs)["containers"]
    c: dict[str, Any] = only
    return c


def config_text(docs: list[dict[str, Any]]) -> str:
    text: str = by_kind(docs)["ConfigMap"]["data"]["config.toml"]
    return text


WEB = ("--set", "webConfig.existingSecret=ile-web", "--set", "webConfig.tls=true")
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "docker discovery": ("--set", "config.discovery.docker.enabled=true"),
    "docker only": (
        "--set",
        "config.discovery.docker.enabled=true",
        "--set",
        "config.discovery.kubernetes.enabled=false",
    ),
    "web config": (
        *WEB,
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "serviceMonitor.tlsConfig.insecureSkipVerify=true",
    ),
    "runtime class nvidia": ("--set", "runtimeClassName=nvidia"),
    "monitors": ("--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true"),
    "alertmanager": (
        "--set",
        "alertmanagerConfig.enabled=true",
        "--set",
        "alertmanagerConfig.webhookUrl=https://pager.example/hook",
    ),
    "static targets": ("-f", str(ROOT / "tests/fixtures/helm/static-targets.yaml")),
    "tuned": (
        "-f",
        str(ROOT / "tests/fixtures/helm/tuned.yaml"),
        # --set as Helm parses it: a list, an indexed list of tables, "" and null
        "--set",
        "extraArgs={--log.level=debug}",
        "--set",
        "extraEnv[0].name=TZ,extraEnv[0].value=UTC",
        "--set",
        "hostPaths.models=",
        "--set",
        "nodeSelector=null",
    ),
}


@pytest.fixture(scope="session")
def rendered(helm_render: Path) -> dict[str, list[dict[str, Any]]]:
    """Every variant, rendered once."""
    return {name: render(helm_render, *args) for name, args in VARIANTS.items()}


def _documents(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for variant, docs in rendered.items():
        for doc in docs:
            yield variant, doc


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_document_of_every_variant_passes_the_schemas(helm_render, rendered, version):
    # rendered against the cluster version checked, as `helm template --kube-version` does
    again = render(helm_render, "--kube-version", version, *VARIANTS["monitors"])
    assert again == rendered["monitors"]
    seen = set()
    for variant, doc in _documents(rendered):
        kind = doc["kind"]
        seen.add(kind)
        if kind in CRD_SCHEMAS:
            jsonschema.validate(doc, CRD_SCHEMAS[kind])
        else:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{variant}: {kind}: {exc}")
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == APP_NAME
    assert seen == {
        "ServiceAccount",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "DaemonSet",
        "ServiceMonitor",
        "PrometheusRule",
        "AlertmanagerConfig",
    }


def test_the_chart_refuses_a_cluster_older_than_the_schemas_cover(helm_render):
    result = helm(helm_render, "--kube-version", "1.24.0")
    assert result.returncode == 1
    assert "chart requires kubeVersion: >=1.25.0-0" in result.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_configmap_passes_the_exporters_check_config(rendered, variant, tmp_path):
    docs = rendered[variant]
    assert f"--config.file={MOUNTED_CONFIG}" in container(docs)["args"]
    text = config_text(docs)
    sockets = []
    if "[discovery.docker]" in text:
        # The Docker daemon's socket as the pod sees it (hostPath, type Socket): a real one.
        path = tmp_path / "docker.sock"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        sockets.append(listener)
        text = text.replace('"/var/run/docker.sock"', f'"{path}"')
        assert str(path) in text
    try:
        result = check_config(text, tmp_path)
    finally:
        for s in sockets:
            s.close()
    assert result.returncode == 0, f"{variant}:\n{text}\n{result.stderr}"


def test_the_container_runs_flags_the_exporter_knows(rendered):
    help_text = subprocess.run(
        [sys.executable, "-m", "exporter", "run", "--help"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    ).stdout  # fmt: skip
    for variant, docs in rendered.items():
        args = container(docs)["args"]
        assert args[0] == "run"
        for flag in args[1:]:
            assert re.fullmatch(r"--[a-z.-]+=\S+", flag), (variant, flag)
            assert flag.split("=")[0] in help_text, (variant, flag)


def settings(text: str) -> Any:
    return parse_settings(tomllib.loads(text), "config.toml", {"NODE_NAME": "gpu-node-7"})


def test_values_reach_the_config_as_the_exporter_reads_them(rendered):
    tuned = settings(config_text(rendered["tuned"]))
    assert tuned.interval_seconds == 0.5
    k = tuned.kubernetes
    assert (k.node_name, k.grace_seconds, k.probe_timeout_seconds) == ("gpu-node-7", 600, 0.3)
    assert (k.name_template, k.select) == ("{namespace}-{pod}", "annotated_or_image")
    assert tuned.docker is None
    docker = settings(config_text(rendered["docker only"]))
    assert docker.kubernetes is None
    assert docker.docker.socket == "/var/run/docker.sock"
    (target,) = settings(config_text(rendered["static targets"])).targets
    assert target.name == "sglang"
    assert target.base_url == "http://127.0.0.1:30000"
    assert target.gpus == (0, 1)
    assert target.completion.model == "kimi-k2"
    assert 'fatal = ["Segmentation \\"fault\\""]' in config_text(rendered["static targets"])


def test_default_discovery_is_the_kubernetes_manifests(rendered):
    """Kubernetes discovery on, docker off, and the same discovery settings as the ConfigMap
    of deploy/kubernetes (which adds a static example target)."""
    chart = settings(config_text(rendered["default"]))
    kustomize = settings(manifests()["ConfigMap"]["data"]["config.toml"])
    assert chart.kubernetes == kustomize.kubernetes
    assert chart.interval_seconds == kustomize.interval_seconds
    assert chart.state_directory == kustomize.state_directory
    assert chart.docker is None
    assert chart.targets == ()


def _substance(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod spec without what names the objects (the chart's names carry the release)."""
    pod = copy.deepcopy(pod)
    pod.pop("serviceAccountName")
    (config,) = [v for v in pod["volumes"] if v["name"] == "config"]
    config["configMap"].pop("name")
    (c,) = pod["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"].pop("scheme", "HTTP") == "HTTP"  # the default, said aloud
    # The chart says the default log level aloud too.
    c["args"] = [a for a in c["args"] if a != "--log.level=info"]
    return pod


def test_default_daemonset_is_the_kubernetes_manifest_in_substance(rendered):
    kustomize = _substance(manifests()["DaemonSet"]["spec"]["template"]["spec"])
    chart = _substance(pod_spec(rendered["runtime class nvidia"]))
    # The chart also tolerates AMD's GPU taint.
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in chart[
        "tolerations"
    ]
    chart["tolerations"] = [t for t in chart["tolerations"] if t["key"] != "amd.com/gpu"]
    assert chart == kustomize
    # Without --set runtimeClassName the pod names none: the cluster's default runtime.
    default = _substance(pod_spec(rendered["default"]))
    assert "runtimeClassName" not in default
    assert {**default, "runtimeClassName": "nvidia"}["containers"] == chart["containers"]
    ds = by_kind(rendered["default"])["DaemonSet"]
    assert ds["spec"]["updateStrategy"] == manifests()["DaemonSet"]["spec"]["updateStrategy"]


def test_the_chart_ships_this_version_of_the_exporter(rendered):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == __version__  # pyproject's version (exporter.__version__)
    assert container(rendered["default"])["image"] == f"inference-lifecycle-exporter:{__version__}"
    labels = by_kind(rendered["default"])["DaemonSet"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/version"] == __version__


def test_daemonset_selects_its_pods_and_the_service_selects_them_too(rendered):
    docs = by_kind(rendered["default"])
    ds = docs["DaemonSet"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert docs["Service"]["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for p in container(rendered["default"])["ports"]}
    assert {p["targetPort"] for p in docs["Service"]["spec"]["ports"]} <= ports
    env = {e["name"]: e for e in container(rendered["default"])["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert ds["metadata"]["namespace"] == "monitoring"


def test_a_changed_config_rolls_the_pods(helm_render, rendered):
    def checksum(docs: list[dict[str, Any]]) -> str:
        ds = by_kind(docs)["DaemonSet"]
        value: str = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    assert re.fullmatch(r"[0-9a-f]{64}", checksum(rendered["default"]))
    assert checksum(rendered["default"]) == checksum(rendered["runtime class nvidia"])
    assert checksum(rendered["default"]) != checksum(rendered["tuned"])


def test_rbac_is_get_list_watch_on_pods_only(rendered):
    docs = by_kind(rendered["default"])
    assert docs["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    assert docs["ClusterRoleBinding"]["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    account = docs["ServiceAccount"]["metadata"]
    assert docs["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": "monitoring"}
    ]
    assert pod_spec(rendered["default"])["serviceAccountName"] == account["name"] == NAME
    assert pod_spec(rendered["default"])["automountServiceAccountToken"] is True
    for docs_ in rendered.values():
        for doc in docs_:
            assert doc["kind"] not in {"Role", "RoleBinding", "Secret"}
            if doc["kind"] == "ClusterRole":
                assert doc["rules"] == docs["ClusterRole"]["rules"]


def test_without_kubernetes_discovery_no_role_and_no_token(rendered):
    docs = rendered["docker only"]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    assert pod_spec(docs)["automountServiceAccountToken"] is False


def test_docker_discovery_mounts_the_socket_read_only(rendered):
    pod = pod_spec(rendered["docker discovery"])
    mounts = {m["name"]: m for m in container(rendered["docker discovery"])["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["docker-socket"] == {
        "name": "docker-socket",
        "mountPath": "/var/run/docker.sock",
        "readOnly": True,
    }
    assert volumes["docker-socket"]["hostPath"] == {
        "path": "/var/run/docker.sock",
        "type": "Socket",
    }
    assert "docker-socket" not in {v["name"] for v in pod_spec(rendered["default"])["volumes"]}


def test_host_paths_are_read_only_but_the_history(rendered):
    for variant in ("default", "tuned"):
        pod = pod_spec(rendered[variant])
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in container(rendered[variant])["volumeMounts"]:
            host = volumes[mount["name"]].get("hostPath")
            if host is None:
                continue
            assert mount["mountPath"] == host["path"]
            writable = host["path"] == "/var/lib/inference-lifecycle-exporter"
            assert mount.get("readOnly", False) is not writable, mount
    tuned = {m["mountPath"] for m in container(rendered["tuned"])["volumeMounts"]}
    assert "/models" not in tuned  # hostPaths.models="" mounts none


def test_operator_tunings_reach_the_pod(rendered):
    pod = pod_spec(rendered["tuned"])
    assert pod["priorityClassName"] == "system-node-critical"
    assert "nodeSelector" not in pod
    ds = by_kind(rendered["tuned"])["DaemonSet"]
    assert ds["spec"]["template"]["metadata"]["annotations"]["team"] == "llm"
    c = container(rendered["tuned"])
    assert c["args"][-1] == "--log.level=debug"
    assert {"name": "TZ", "value": "UTC"} in c["env"]
    assert pod_spec(rendered["default"])["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_web_config_from_a_secret_passes_check_config(rendered, tmp_path):
    docs = rendered["web config"]
    c = container(docs)
    (flag,) = [a for a in c["args"] if a.startswith("--web.config.file=")]
    web_config = flag.partition("=")[2]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    directory = os.path.dirname(web_config)
    assert mounts[directory]["readOnly"] is True
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes[mounts[directory]["name"]]["secret"] == {"secretName": "ile-web"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    (endpoint,) = by_kind(docs)["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # The Secret as the pod sees it: the web config and the files it names, side by side.
    secret = tmp_path / "secret"
    secret.mkdir()
    tls = make_tls_files(secret)
    (secret / os.path.basename(web_config)).write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": os.path.basename(tls.cert_file),
                    "key_file": os.path.basename(tls.key_file),
                }
            }
        )
    )
    mounted = str(secret / os.path.basename(web_config))
    result = check_config(config_text(docs), tmp_path, "--web.config.file", mounted)
    assert result.returncode == 0, result.stderr
    (secret / os.path.basename(tls.key_file)).unlink()
    result = check_config(config_text(docs), tmp_path, "--web.config.file", mounted)
    assert result.returncode == 2
    assert f"{tls.key_file}: [Errno 2]" in result.stderr  # resolved beside the web config


def test_service_monitor_keeps_the_job_the_alerts_match(rendered):
    docs = by_kind(rendered["monitors"])
    monitor = docs["ServiceMonitor"]
    service = docs["Service"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    # prometheus-operator takes the job from this Service label: the name InferenceExporterDown
    # matches (up{job="inference-lifecycle-exporter"}), whatever the release is called.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == APP_NAME
    assert (
        'up{job="inference-lifecycle-exporter"}'
        in (ROOT / "deploy/prometheus/alerts.yml").read_text()
    )
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    assert "ServiceMonitor" not in {d["kind"] for d in rendered["default"]}
    assert "PrometheusRule" not in {d["kind"] for d in rendered["default"]}


def test_service_monitor_without_the_service_is_refused(helm_render):
    result = helm(
        helm_render, "--set", "serviceMonitor.enabled=true", "--set", "service.enabled=false"
    )
    assert result.returncode == 1
    assert "serviceMonitor.enabled needs service.enabled" in result.stderr


def test_prometheus_rule_carries_the_rule_files_unchanged(rendered):
    groups = by_kind(rendered["monitors"])["PrometheusRule"]["spec"]["groups"]
    sources = [
        g
        for name in ("rules.yml", "alerts.yml")
        for g in yaml.safe_load((ROOT / "deploy/prometheus" / name).read_text())["groups"]
    ]
    assert groups == sources
    # the alerts' own templates pass through Helm's untouched
    assert any(
        "{{ $labels.target }}" in str(r.get("annotations")) for g in groups for r in g["rules"]
    )


def test_alertmanager_config_is_the_shipped_example_with_the_values_webhook(rendered):
    docs = by_kind(rendered["alertmanager"])
    spec = docs["AlertmanagerConfig"]["spec"]
    expected = manifests()["AlertmanagerConfig"]["spec"]
    assert spec["receivers"][0]["webhookConfigs"][0]["url"] == "https://pager.example/hook"
    expected["receivers"][0]["webhookConfigs"][0]["url"] = "https://pager.example/hook"
    assert spec == expected
    assert "AlertmanagerConfig" not in by_kind(rendered["default"])  # optional


def test_alertmanager_config_without_a_webhook_is_refused(helm_render):
    result = helm(helm_render, "--set", "alertmanagerConfig.enabled=true")
    assert result.returncode != 0
    assert "alertmanagerConfig.webhookUrl" in result.stderr


def test_the_charts_copy_of_the_rules_is_current(tmp_path):
    copy_ = CHART / "files/rule-groups.yaml"
    result = subprocess.run(
        [sys.executable, "tools/render_deploy.py", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # --check names the chart's copy when it lags behind the rule files
    stale = tmp_path / "repo"
    shutil.copytree(ROOT / "deploy", stale / "deploy")
    shutil.copytree(ROOT / "tools", stale / "tools", ignore=shutil.ignore_patterns("helm-render"))
    (stale / "deploy/helm/inference-lifecycle-exporter/files/rule-groups.yaml").write_text(
        copy_.read_text().replace("severity: critical", "severity: page", 1)
    )
    result = subprocess.run(
        [sys.executable, "tools/render_deploy.py", "--check"],
        capture_output=True,
        text=True,
        cwd=stale,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "deploy/helm/inference-lifecycle-exporter/files/rule-groups.yaml: stale" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "config.interval=5"),
            "config.interval: Invalid type. Expected: string, given: integer",
        ),
        (("--set", "config.interval=fast"), "config.interval: Does not match pattern"),
        (
            ("--set", "config.discovery.kubernetes.grase=5m"),
            "Additional property grase is not allowed",
        ),
        (
            ("--set", "config.discovery.kubernetes.select=all"),
            "config.discovery.kubernetes.select: config.discovery.kubernetes.select must be one of",
        ),
        (("--set", "port=70000"), "port: Must be less than or equal to 65535"),
        (
            ("--set", "hostPaths.cgroup=sys/fs/cgroup"),
            "hostPaths.cgroup: Does not match pattern '^/[^\\x00-\\x1f\\x7f#]*$'",
        ),
        (
            ("--set", "webConfig.tls=yes"),
            "webConfig.tls: Invalid type. Expected: boolean, given: string",
        ),
    ],
)
def test_bad_values_are_refused_by_the_schema_before_rendering(helm_render, args, message):
    result = helm(helm_render, *args)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(
        "Error: values don't meet the specifications of the schema(s) in the following chart(s):\n"
        "inference-lifecycle-exporter:\n"
    )
    assert message in result.stderr


def test_notes_say_how_to_look_and_how_to_probe(helm_render):
    result = helm(helm_render, "--notes", *WEB)
    assert result.returncode == 0, result.stderr
    assert f"kubectl -n monitoring port-forward ds/{NAME} 10049" in result.stdout
    assert "curl -s https://127.0.0.1:10049/status" in result.stdout
    assert 'path: "/probe?target=NAMESPACE/POD", scheme: HTTPS' in result.stdout


def _readme_install() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(helm install [^`]*)```", text)
    assert block, "README: no helm install block"
    return shlex.split(block.group(1).replace("\\\n", " "))


def test_readme_helm_install_renders(helm_render):
    words = _readme_install()
    assert words[:3] == ["helm", "install", "inference-lifecycle-exporter"]
    assert words[3] == "deploy/helm/inference-lifecycle-exporter"
    assert (ROOT / words[3] / "Chart.yaml").is_file()
    flags = words[4:]
    assert flags[flags.index("-n") + 1] == "monitoring"
    sets = [flags[i + 1] for i, w in enumerate(flags) if w == "--set"]
    assert sets
    docs = render(helm_render, *(a for s in sets for a in ("--set", s)))
    assert by_kind(docs)["DaemonSet"]
    text = (ROOT / "README.md").read_text()
    assert "startupProbe:" in text and "/probe?target=" in text  # the probe example


def test_the_renderer_follows_helms_rules_on_a_small_chart(helm_render, tmp_path):
    """What the chart relies on, each as Helm documents it: values layering (values.yaml,
    then -f in order, then --set; a null deletes a default), partials parsed but not
    rendered, include/tpl/required, missing keys empty, whitespace-only files dropped,
    documents in install order, .Files outside templates/, and .Release/.Chart/.Capabilities.
    """
    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "files").mkdir()
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: demo\nversion: 1.2.3\nappVersion: '9'\n"
    )
    (chart / "values.yaml").write_text("a: {b: 1, c: 2, d: {e: 3}}\nname: x\nkeep: k\ndrop: d\n")
    (chart / "files/raw.txt").write_text("{{ not a template }}\n")
    (chart / "templates/_helpers.tpl").write_text('{{- define "demo.n" -}}n-{{ . }}{{- end }}\n')
    (chart / "templates/empty.yaml").write_text("{{- if false }}\nkind: Nothing\n{{- end }}\n  \n")
    (chart / "templates/cm.yaml").write_text(
        "kind: ConfigMap\ndata:\n"
        "  values: {{ toJson .Values | quote }}\n"
        '  include: {{ include "demo.n" .Values.name }}\n'
        '  tpl: {{ tpl "{{ .Release.Name }}-{{ .Values.keep }}" . }}\n'
        "  missing: '{{ .Values.nope }}'\n"
        '  raw: {{ .Files.Get "files/raw.txt" | trim | quote }}\n'
        "  meta: {{ .Chart.Name }}-{{ .Chart.Version }}-{{ .Chart.AppVersion }}\n"
        "  release: {{ .Release.Namespace }}/{{ .Release.Service }}/{{ .Release.IsInstall }}\n"
        "  caps: {{ .Capabilities.KubeVersion.Minor }}"
        '/{{ .Capabilities.APIVersions.Has "apps/v1" }}'
        '/{{ .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}\n'
        "  template: {{ .Template.Name }}\n"
        "---\nkind: Namespace\n"
    )
    (chart / "templates/sa.yaml").write_text("kind: ServiceAccount\n")
    first = tmp_path / "one.yaml"
    first.write_text("a: {b: 10, d: {f: 4}}\nname: from-file\n")
    second = tmp_path / "two.yaml"
    second.write_text("a: {b: 20}\ndrop: null\n")
    result = helm(
        helm_render,
        "-f", str(first), "-f", str(second), "--set", "a.c=30,name=from-set",
        "--api-versions", "monitoring.coreos.com/v1", "--kube-version", "1.29.3",
        chart=chart,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    sources = re.findall(r"^# Source: (.*)$", result.stdout, re.MULTILINE)
    assert sources == ["demo/templates/cm.yaml", "demo/templates/sa.yaml", "demo/templates/cm.yaml"]
    namespace, account, cm = yaml.safe_load_all(result.stdout)
    assert (namespace["kind"], account["kind"]) == ("Namespace", "ServiceAccount")
    data = cm["data"]
    values = yaml.safe_load(data["values"])
    assert values == {
        "a": {"b": 20, "c": 30, "d": {"e": 3, "f": 4}},
        "name": "from-set",
        "keep": "k",
    }
    assert data["include"] == "n-from-set"
    assert data["tpl"] == "ile-k"
    assert data["missing"] == ""
    assert data["raw"] == "{{ not a template }}"
    assert data["meta"] == "demo-1.2.3-9"
    assert data["release"] == "monitoring/Helm/true"
    assert data["caps"] == "29/true/true"
    assert data["template"] == "demo/templates/cm.yaml"
    (chart / "templates/sa.yaml").write_text('{{ required "name the account" .Values.account }}\n')
    result = helm(helm_render, chart=chart)
    assert result.returncode == 1
    assert result.stderr == (
        "Error: execution error at (demo/templates/sa.yaml:1:3): name the account\n"
    )


def test_notes_probe_the_engine_as_the_readme_does(helm_render):
    """The startup and liveness probes both ask the exporter; readiness asks the engine."""
    notes = helm(helm_render, "--notes").stdout
    text = notes[notes.index("  startupProbe:") :].split("\n\n")[0]
    probes = yaml.safe_load(text.replace("NAMESPACE/POD", "ns/pod"))
    readme = manifest_in(
        (ROOT / "README.md").read_text(), "### Probes that know a slow load from a hang", {}
    )
    for kind in ("startupProbe", "livenessProbe"):
        assert probes[kind]["httpGet"]["path"] == "/probe?target=ns/pod"
        assert {k: v for k, v in probes[kind].items() if k != "httpGet"} == {
            k: v for k, v in readme[kind].items() if k != "httpGet"
        }
    assert (
        probes["readinessProbe"]["httpGet"]["path"] == readme["readinessProbe"]["httpGet"]["path"]
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("runtimeClassName=nvidia\nhostIPC: true", "runtimeClassName: Does not match pattern"),
        ("hostPaths.state=/var/lib/ile #", "hostPaths.state: Does not match pattern"),
        ("hostPaths.log=relative/log", "hostPaths.log: Does not match pattern"),
        ("webConfig.existingSecret=a b", "webConfig.existingSecret: Does not match pattern"),
    ],
    ids=["newline", "comment", "relative", "space"],
)
def test_values_that_would_rewrite_the_pod_spec_are_refused(helm_render, value, message):
    """Before: a runtimeClassName with a newline rendered ``hostIPC: true`` into the pod."""
    result = helm(helm_render, "--set-string", value)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_every_string_value_is_quoted_so_yaml_reads_it_back_unchanged(helm_render):
    """``null`` and ``a: b`` are values the schema allows that bare YAML would misread."""
    docs = render(
        helm_render,
        "--set-string",
        "runtimeClassName=null",
        "--set-string",
        "hostPaths.state=/var/lib/ile: state",
    )
    pod = pod_spec(docs)
    assert pod["runtimeClassName"] == "null"
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    assert state["hostPath"]["path"] == "/var/lib/ile: state"
    assert 'state_directory = "/var/lib/ile: state"' in config_text(docs)
