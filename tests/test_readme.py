"""The README stays true: its metrics table, quick start and DaemonSet excerpt match what ships."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.engines import ENGINES

ROOT = Path(__file__).resolve().parents[1]
#: The main golden file, and the MIG one (with every GPU health reading) whose MIG and
#: healthy-GPU series the main one renders empty.
GOLDENS = (
    ROOT / "tests/fixtures/metrics/two-targets-four-gpus.prom",
    ROOT / "tests/fixtures/metrics/mig-two-slices.prom",
)


def readme_metrics() -> dict[str, tuple[str, set[str]]]:
    rows = re.findall(
        r"^\| `(inference_[a-z_]+)` \| (\w+) \|([^|]*)\|",
        (ROOT / "README.md").read_text(),
        re.MULTILINE,
    )
    return {
        name: (kind, {x.strip() for x in labels.split(",") if x.strip()})
        for name, kind, labels in rows
    }


def rendered_metrics() -> dict[str, tuple[str, set[str]]]:
    out: dict[str, tuple[str, set[str]]] = {}
    for golden in GOLDENS:
        for fam in text_string_to_metric_families(golden.read_text()):
            labels = {k for s in fam.samples for k in s.labels if k != "le"}
            name = fam.name + ("_total" if fam.type == "counter" else "")
            out[name] = (fam.type, out.get(name, ("", set()))[1] | labels)
    return out


def test_readme_metrics_table_matches_the_collector():
    assert readme_metrics() == rendered_metrics()


def test_readme_quick_start_is_the_two_make_commands_ci_runs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```sh\n(.*?)```", text, re.DOTALL)
    assert block
    commands = [ln.split("#")[0].strip() for ln in block.group(1).splitlines() if ln.strip()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci/run").read_text()


def _within(part: object, whole: object) -> bool:
    """Whether every key and list item of part is in whole (list items anywhere in the list)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and _within(v, whole[k]) for k, v in part.items()
        )
    if isinstance(part, list):
        return isinstance(whole, list) and all(any(_within(p, w) for w in whole) for p in part)
    return part == whole


def test_readme_daemonset_excerpt_is_the_shipped_manifest():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"In substance the DaemonSet is this.*?```yaml\n(.*?)```", text, re.DOTALL)
    assert block
    excerpt = yaml.safe_load(block.group(1))
    shipped = yaml.safe_load((ROOT / "deploy/kubernetes/daemonset.yaml").read_text())
    assert _within(excerpt, shipped)
    pod = excerpt["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        container["env"]
    )
    assert not _within({"spec": {"template": {"spec": {"hostPID": False}}}}, shipped)


@pytest.mark.integration
def test_a_clone_without_the_corpus_says_why_its_tests_are_skipped(tmp_path):
    # Issue 30 #18: a bare clone folded ~240 corpus tests into "2 skipped", no reason shown.
    readme = (ROOT / "README.md").read_text()
    assert "INFERENCE_LOG_CORPUS" in readme and "../shared/fixtures/logs" in readme
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["INFERENCE_LOG_CORPUS"] = str(tmp_path / "absent")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_corpus.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 5, done.stdout + done.stderr  # pytest: no test ran
    assert f"log corpus not found at {tmp_path / 'absent'}" in done.stdout, done.stdout


def test_the_config_table_names_every_engine_and_its_own_health_path():
    # Issue 33: engines added without the README left a reader guessing the names to write.
    rows = {
        ln.split("|")[1].strip(): ln
        for ln in (ROOT / "README.md").read_text().splitlines()
        if ln.startswith("| `")
    }
    assert re.findall(r"`(\w+)`", rows["`engine`"])[2:] == list(ENGINES)
    assert all(e.health_path in rows["`health_path`"] for e in ENGINES.values())
