"""Alert and recording rules: promtool accepts and unit-tests them; their shape and names hold."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy/prometheus"
RULE_FILES = (PROM / "alerts.yml", PROM / "rules.yml")
GOLDEN = ROOT / "tests/fixtures/metrics/two-targets-four-gpus.prom"
RUNBOOK_BASE = (
    "https://github.com/inference-lifecycle-exporter/inference-lifecycle-exporter"
    "/blob/main/docs/runbooks/"
)
# What the stall and failure alerts add for the person paged (deploy/alertmanager templates).
ON_CALL = frozenset({"phase", "reason", "last_progress", "page"})
# Series Prometheus itself makes for every scrape target, not the exporter.
PROMETHEUS_SERIES = frozenset({"up", "ALERTS"})
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless"}
    | {"bool", "offset", "inf", "nan"}
)


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool (Debian package prometheus) must be installed; make test does it"
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, check=False
    )


def rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def alerts() -> list[dict[str, Any]]:
    return rules(PROM / "alerts.yml")


def metric_names(expr: str) -> set[str]:
    """Series names a PromQL expression selects (functions, labels and keywords removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings may hold anything
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables such as $__rate_interval
    names = set()
    for m in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if not m.group(2) and m.group(1).lower() not in _KEYWORDS:
            names.add(m.group(1))
    return names


def golden_names() -> set[str]:
    """Every series name in the golden exposition, histogram suffixes included."""
    names = set()
    for line in GOLDEN.read_text().splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def recorded_names() -> set[str]:
    return {r["record"] for r in rules(PROM / "rules.yml")}


def test_metric_name_extraction_sees_selectors_not_functions_or_labels():
    expr = (
        'sum by (deployment) (rate(inference_server_restarts_total{target=~"$target"}'
        "[$__rate_interval])) / on (job, instance) group_left (model) inference_server_info"
        " and time() - inference_exporter_last_tick_timestamp_seconds offset 5m > 1e3"
    )
    assert metric_names(expr) == {
        "inference_server_restarts_total",
        "inference_server_info",
        "inference_exporter_last_tick_timestamp_seconds",
    }


def test_promtool_check_rules_accepts_both_files():
    result = run_promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 14 rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = run_promtool("test", "rules", *map(str, sorted((PROM / "tests").glob("*.yml"))))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_broken_alert(tmp_path):
    """The unit tests can fail: a stall alert that ignores the flag's value breaks them."""
    (tmp_path / "tests").mkdir()
    broken = (
        (PROM / "alerts.yml")
        .read_text()
        .replace("(inference_server_stalled == 1)", "(inference_server_stalled >= 0)")
    )
    assert broken != (PROM / "alerts.yml").read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(PROM / "tests/alerts_test.yml", tmp_path / "tests/alerts_test.yml")
    result = run_promtool("test", "rules", str(tmp_path / "tests/alerts_test.yml"))
    assert result.returncode != 0
    assert "InferenceColdStartStalled" in result.stdout + result.stderr


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_alert_has_the_node_mixin_shape(alert):
    assert re.fullmatch(r"\d+[smh]", str(alert.get("for", ""))), "needs a for:"
    assert alert["labels"]["severity"] in ("warning", "critical")
    annotations = alert["annotations"]
    missing = {"summary", "description", "runbook", "runbook_url"} - set(annotations)
    assert not missing, f"needs {missing} (runbook_url: {RUNBOOK_BASE}{alert['alert']}.md)"
    assert set(annotations) <= {"summary", "description", "runbook", "runbook_url"} | ON_CALL
    assert all(len(text) > 20 for text in annotations.values())
    assert annotations["summary"].endswith(".")


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_alert_links_its_own_runbook_page(alert):
    url = alert["annotations"].get("runbook_url", "")
    assert url.startswith(RUNBOOK_BASE), url
    page = ROOT / "docs/runbooks" / url.removeprefix(RUNBOOK_BASE)
    assert page.name == f"{alert['alert']}.md"
    assert page.is_file(), f"write {page.relative_to(ROOT)} (see docs/runbooks/README.md)"
    text = page.read_text()
    assert text.startswith(f"# {alert['alert']}\n")
    for section in ("## What it means", "## Confirm it", "## Usual causes", "## What to do"):
        assert section in text, f"{page.name}: no {section!r}"


def test_every_runbook_page_belongs_to_an_alert():
    names = {a["alert"] for a in alerts()}
    pages = {p.stem for p in (ROOT / "docs/runbooks").glob("*.md")} - {"README"}
    assert pages == names
    index = (ROOT / "docs/runbooks/README.md").read_text()
    assert {n for n in names if f"[{n}.md]({n}.md)" not in index} == set(), "list it in README.md"


def _unit_test_cases() -> list[dict[str, Any]]:
    cases = []
    for path in sorted((PROM / "tests").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["tests"]:
            cases.extend(group.get("alert_rule_test", []))
    return cases


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_alert_has_a_firing_and_a_quiet_unit_test(alert):
    cases = [c for c in _unit_test_cases() if c["alertname"] == alert["alert"]]
    assert any(c.get("exp_alerts") for c in cases), "no case where it fires"
    assert any(not c.get("exp_alerts") for c in cases), "no case where it stays quiet"


def test_rules_use_only_metrics_the_exporter_exposes():
    exposed = golden_names() | recorded_names() | PROMETHEUS_SERIES
    used = {name for path in RULE_FILES for r in rules(path) for name in metric_names(r["expr"])}
    assert used, "no metric names found in the rules"
    assert used - exposed == set()
