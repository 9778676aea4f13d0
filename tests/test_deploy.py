"""Deployment files: the hardened systemd unit, Kubernetes manifests and Prometheus wiring."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter.config import DEFAULT_STATE_DIRECTORY

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "inference-lifecycle-exporter.service"
K8S = DEPLOY / "kubernetes"
CAPS = {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}
# Oldest Kubernetes the package ships schemas for, and the newest.
K8S_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
APP = {"app.kubernetes.io/name": "inference-lifecycle-exporter"}


def run(*cmd: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT, **kwargs
    )


def directives(path: Path = UNIT) -> list[tuple[str, str, str]]:
    """(section, key, value) for every line of a unit file; keys may repeat."""
    out, section = [], ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            out.append((section, key, value))
    return out


def service(key: str) -> list[str]:
    return [v for s, k, v in directives() if s == "Service" and k == key]


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze missing: apt-get install -y systemd"
    version = int(run(found, "--version").stdout.split()[1])
    assert version >= 252, "security --offline needs systemd 252 or newer"
    return found


def exposure(unit: Path) -> tuple[int, float]:
    result = run(systemd_analyze(), "security", "--offline=yes", "--threshold=30", str(unit))
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    return result.returncode, float(found.group(1))


# --- systemd ----------------------------------------------------------------------------------


def test_unit_passes_the_offline_security_gate():
    rc, score = exposure(UNIT)
    assert rc == 0
    assert score <= 3.0


def test_the_gate_fails_a_unit_without_hardening(tmp_path):
    bare = tmp_path / "inference-lifecycle-exporter.service"
    bare.write_text("[Service]\nType=notify\nExecStart=/usr/bin/env true\n")
    rc, score = exposure(bare)
    assert rc != 0
    assert score > 3.0


def test_unit_verifies_cleanly(tmp_path):
    """systemd-analyze verify, with ExecStart pointed at this checkout's interpreter."""
    unit = tmp_path / UNIT.name
    unit.write_text(
        UNIT.read_text().replace(
            "ExecStart=/usr/local/bin/inference-lifecycle-exporter",
            f"ExecStart={sys.executable} -m exporter",
        )
    )
    assert unit.read_text() != UNIT.read_text()
    result = run(systemd_analyze(), "verify", str(unit))
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


def test_verify_would_catch_a_misspelt_directive(tmp_path):
    unit = tmp_path / UNIT.name
    unit.write_text(
        UNIT.read_text()
        .replace("ProtectHome=read-only", "ProtectHomes=read-only")
        .replace("/usr/local/bin/inference-lifecycle-exporter", "/usr/bin/env")
    )
    result = run(systemd_analyze(), "verify", str(unit))
    assert "Unknown key 'ProtectHomes'" in result.stderr


def test_unit_is_notify_with_a_watchdog_and_flags_from_an_environment_file():
    assert service("Type") == ["notify"]
    assert service("NotifyAccess") == ["main"]
    assert re.fullmatch(r"\d+s", service("WatchdogSec")[0])
    assert service("EnvironmentFile") == ["-/etc/default/inference-lifecycle-exporter"]
    assert service("ExecStart")[0].endswith(" run $ARGS")
    assert service("DynamicUser") == ["yes"] or service("User")
    assert service("SupplementaryGroups") == ["systemd-journal"]


def test_unit_starts_after_the_clock_is_synchronised():
    unit = [(k, v.split()) for s, k, v in directives() if s == "Unit"]
    assert any(k == "After" and "time-sync.target" in v for k, v in unit)
    assert any(k == "Wants" and "time-sync.target" in v for k, v in unit)


def test_state_directory_is_where_the_config_keeps_history():
    (name,) = service("StateDirectory")
    assert f"/var/lib/{name}" == DEFAULT_STATE_DIRECTORY
    assert service("ProtectSystem") == ["strict"]


def test_only_the_two_capabilities_proc_io_needs():
    for key in ("AmbientCapabilities", "CapabilityBoundingSet"):
        (value,) = service(key)
        assert set(value.split()) == CAPS


@pytest.mark.parametrize(
    ("key", "breaking"),
    [
        ("PrivateDevices", None),  # hides /dev/nvidia*
        ("PrivateUsers", None),  # CAP_SYS_PTRACE no longer reaches host processes
        ("ProtectProc", "invisible"),  # hides other users' processes
        ("ProcSubset", "pid"),  # hides /proc/diskstats
        ("MemoryDenyWriteExecute", None),  # unproven with libnvidia-ml and ctypes
        ("IPAddressDeny", None),  # would block probes and scrapes
    ],
)
def test_no_setting_that_would_break_the_exporter(key, breaking):
    values = service(key)
    assert values == [] if breaking is None else breaking not in values


def test_environment_file_example_uses_flags_the_daemon_knows():
    text = (DEPLOY / "inference-lifecycle-exporter.default").read_text()
    (args,) = re.findall(r'^ARGS="(.*)"$', text, flags=re.MULTILINE)
    help_text = run(sys.executable, "-m", "exporter", "run", "--help").stdout
    flags = [a.split("=")[0] for a in args.split()]
    assert flags
    for flag in flags:
        assert flag in help_text


# --- Kubernetes -------------------------------------------------------------------------------


def manifests() -> dict[str, dict[str, Any]]:
    """kind -> document, for every manifest in deploy/kubernetes."""
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


CORE = ("DaemonSet", "Service", "ConfigMap")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("kind", CORE)
def test_core_manifests_validate_against_the_kubernetes_schema(kind, version):
    kubernetes_validate.validate(manifests()[kind], version, strict=True)


def test_the_kubernetes_schema_catches_a_misspelt_field():
    ds = manifests()["DaemonSet"]
    ds["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSIONS[-1], strict=True)


_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string", "pattern": "^[a-z0-9-]+$"}, "labels": _LABELS},
}
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "action": {"type": "string"},
    },
}
_SECRET_KEY = {
    "type": "object",
    "required": ["name", "key"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "key": {"type": "string"},
        "optional": {"type": "boolean"},
    },
}
_SECRET_OR_CONFIGMAP = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY},
}
_ENDPOINT = {
    "type": "object",
    "required": ["port"],
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        # SafeTLSConfig and BasicAuth: what a scrape over the exporter's web config needs
        "tlsConfig": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "ca": _SECRET_OR_CONFIGMAP,
                "cert": _SECRET_OR_CONFIGMAP,
                "keySecret": _SECRET_KEY,
                "serverName": {"type": "string"},
                "insecureSkipVerify": {"type": "boolean"},
            },
        },
        "basicAuth": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"username": _SECRET_KEY, "password": _SECRET_KEY},
        },
        "path": {"type": "string"},
        "scheme": {"enum": ["http", "https"]},
        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "relabelings": {"type": "array", "items": _RELABEL},
    },
}
_SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "properties": {"matchLabels": _LABELS},
}
_RULE = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string"},
        "record": {"type": "string"},
        "expr": {"type": "string"},
        "for": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "labels": _LABELS,
        "annotations": _LABELS,
    },
}


def _crd(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The monitoring.coreos.com/v1 fields we use: a focused slice of prometheus-operator's CRD."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _META,
            "spec": {"type": "object", "additionalProperties": False, **spec},
        },
    }


def _monitor(kind: str, endpoints: str) -> dict[str, Any]:
    return _crd(
        kind,
        {
            "required": ["selector", endpoints],
            "properties": {
                "selector": _SELECTOR,
                "jobLabel": {"type": "string"},
                endpoints: {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
        },
    )


_AM_MATCHERS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string"},
            "value": {"type": "string"},
            "matchType": {"enum": ["=", "!=", "=~", "!~"]},
        },
    },
}
_AM_ROUTE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "receiver": {"type": "string"},
        "groupBy": {"type": "array", "items": {"type": "string"}},
        "groupWait": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "groupInterval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "repeatInterval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "matchers": _AM_MATCHERS,
        "continue": {"type": "boolean"},
        "routes": {"type": "array", "items": {"$ref": "#/$defs/route"}},
    },
}
# monitoring.coreos.com/v1alpha1 AlertmanagerConfig: the fields the example uses.
_ALERTMANAGER_CONFIG = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "$defs": {"route": _AM_ROUTE},
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1alpha1"},
        "kind": {"const": "AlertmanagerConfig"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["route", "receivers"],
            "properties": {
                "route": {"$ref": "#/$defs/route", "required": ["receiver"]},
                "receivers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "webhookConfigs": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["url"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "url": {"type": "string", "pattern": "^https?://"},
                                        "sendResolved": {"type": "boolean"},
                                    },
                                },
                            },
                        },
                    },
                },
                "inhibitRules": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "sourceMatch": _AM_MATCHERS,
                            "targetMatch": _AM_MATCHERS,
                            "equal": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                },
            },
        },
    },
}


CRD_SCHEMAS = {
    "AlertmanagerConfig": _ALERTMANAGER_CONFIG,
    "ServiceMonitor": _monitor("ServiceMonitor", "endpoints"),
    "PodMonitor": _monitor("PodMonitor", "podMetricsEndpoints"),
    "PrometheusRule": _crd(
        "PrometheusRule",
        {
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "interval": {"type": "string"},
                            "rules": {"type": "array", "minItems": 1, "items": _RULE},
                        },
                    },
                }
            },
        },
    ),
}


@pytest.mark.parametrize("kind", sorted(CRD_SCHEMAS))
def test_prometheus_operator_resources_match_their_schema(kind):
    jsonschema.validate(manifests()[kind], CRD_SCHEMAS[kind])


def test_crd_schema_catches_a_misspelt_field():
    monitor = manifests()["ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["scrapeInterval"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, CRD_SCHEMAS["ServiceMonitor"])


def _pod() -> Any:
    return manifests()["DaemonSet"]["spec"]["template"]["spec"]


def test_daemonset_sees_host_processes_with_only_two_capabilities():
    pod = _pod()
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert "privileged" not in security


def test_daemonset_mounts_journal_read_only_and_state_on_the_host():
    pod = _pod()
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in ("/var/log", "/run/log", "/etc/machine-id"):
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    state = mounts[DEFAULT_STATE_DIRECTORY]
    assert not state.get("readOnly")
    assert volumes[state["name"]]["hostPath"]["path"] == DEFAULT_STATE_DIRECTORY


def check_config(
    text: str, directory: Path, *flags: str, node: str = "gpu-node-7"
) -> subprocess.CompletedProcess[str]:
    """The real ``check-config`` on a config.toml text, as the DaemonSet on ``node`` runs it.

    Outside the cluster the service account is missing: a kubeconfig stands in for it.
    """
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\nusers: []\n"
    )
    if "[discovery.kubernetes]\n" in text:
        text = text.replace(
            "[discovery.kubernetes]\n", f'[discovery.kubernetes]\nkubeconfig = "{kubeconfig}"\n'
        )
        assert str(kubeconfig) in text
    config = directory / "config.toml"
    config.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", "--config.file", str(config), *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NODE_NAME": node},
        timeout=60,
        check=False,
    )


def test_daemonset_config_passes_check_config(tmp_path):
    args = _pod()["containers"][0]["args"]
    assert "--config.file=/etc/inference-lifecycle-exporter/config.toml" in args
    result = check_config(manifests()["ConfigMap"]["data"]["config.toml"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pods of node gpu-node-7" in result.stdout


def test_discovery_may_read_pods_of_the_node_and_nothing_else():
    docs = {}
    for doc in yaml.safe_load_all((K8S / "rbac.yaml").read_text()):
        docs[doc["kind"]] = doc
    assert docs["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = docs["ClusterRoleBinding"]
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]
    pod = _pod()
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        kubernetes_validate.validate(docs[kind], K8S_VERSIONS[-1], strict=True)


def test_service_and_monitors_select_the_daemonset_pods_by_port_name():
    docs = manifests()
    pod_labels = docs["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in _pod()["containers"][0]["ports"]}
    assert docs["Service"]["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in docs["Service"]["spec"]["ports"]} <= port_names
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        assert docs[kind]["spec"]["selector"]["matchLabels"] == APP
        assert {e["port"] for e in docs[kind]["spec"][key]} <= port_names
    # the job label the alert rules match: the Service's name, or the pod label for PodMonitor
    assert docs["Service"]["metadata"]["name"] == "inference-lifecycle-exporter"
    assert pod_labels[docs["PodMonitor"]["spec"]["jobLabel"]] == "inference-lifecycle-exporter"


def test_kustomization_lists_existing_files():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    assert "podmonitor.yaml" not in kustomization["resources"]  # an alternative, not both


def test_prometheusrule_is_generated_from_the_rule_files():
    result = run(sys.executable, "tools/render_deploy.py", "--check")
    assert result.returncode == 0, result.stderr
    groups = manifests()["PrometheusRule"]["spec"]["groups"]
    sources = [
        g
        for name in ("rules.yml", "alerts.yml")
        for g in yaml.safe_load((DEPLOY / "prometheus" / name).read_text())["groups"]
    ]
    assert groups == sources


def test_alertmanagerconfig_is_the_shipped_alertmanager_example(tmp_path):
    """The operator's copy routes and inhibits as alertmanager.yml (which amtool checks)."""
    spec = manifests()["AlertmanagerConfig"]["spec"]
    example = yaml.safe_load((DEPLOY / "alertmanager/alertmanager.yml").read_text())
    route = example["route"]
    assert spec["route"]["groupBy"] == route["group_by"] == ["alertname", "model"]
    assert spec["route"]["groupWait"] == route["group_wait"]
    assert spec["route"]["receiver"] == spec["receivers"][0]["name"]
    assert [
        (r["sourceMatch"][0]["value"], r["targetMatch"][0]["value"]) for r in spec["inhibitRules"]
    ] == [
        ("InferenceStartFailed", "InferenceColdStartStalled"),
        ("InferenceColdStartStalled", "InferenceColdStartSlowerThanHistory"),
    ]
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "alertmanagerconfig.yaml" not in kustomization["resources"]  # optional, by hand


def test_alertmanagerconfig_schema_catches_a_snake_case_field():
    doc = manifests()["AlertmanagerConfig"]
    doc["spec"]["route"]["group_wait"] = "30s"  # alertmanager.yml's spelling, not the CRD's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, CRD_SCHEMAS["AlertmanagerConfig"])


def test_prometheusrule_groups_pass_promtool(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": manifests()["PrometheusRule"]["spec"]["groups"]}))
    result = run(shutil.which("promtool") or "promtool", "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


def test_scrape_config_example_is_valid_prometheus_config():
    example = DEPLOY / "prometheus/scrape-config.example.yml"
    result = run(shutil.which("promtool") or "promtool", "check", "config", str(example))
    assert result.returncode == 0, result.stdout + result.stderr
    (job,) = yaml.safe_load(example.read_text())["scrape_configs"]
    assert job["job_name"] == "inference-lifecycle-exporter"
