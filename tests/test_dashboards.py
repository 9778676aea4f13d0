"""Grafana dashboards: generated JSON is current, schema-valid, portable, uses real metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.test_rules import PROMETHEUS_SERIES, golden_names, metric_names, recorded_names

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "grafana").glob("*.json"))
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# The fields Grafana needs to import a dashboard and lay out and query its panels; not the
# whole Grafana schema (which is CUE, not JSON Schema), but the parts a hand edit breaks.
_QUERY = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "datasource": {"const": DATASOURCE},
        "instant": {"type": "boolean"},
        "range": {"type": "boolean"},
        "legendFormat": {"type": "string"},
    },
}
_GRID = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
    },
}
_PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {
            "enum": ["row", "timeseries", "stat", "gauge", "bargauge", "table", "state-timeline"]
        },
        "title": {"type": "string", "minLength": 1},
        "gridPos": _GRID,
        "datasource": {"const": DATASOURCE},
        "targets": {"type": "array", "items": _QUERY},
        "fieldConfig": {
            "type": "object",
            "required": ["defaults", "overrides"],
            "properties": {"defaults": {"type": "object"}, "overrides": {"type": "array"}},
        },
        "options": {"type": "object"},
    },
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {"required": ["panels", "collapsed"]},
    "else": {"required": ["targets", "datasource"], "properties": {"targets": {"minItems": 1}}},
}
_VARIABLE = {
    "type": "object",
    "required": ["name", "type"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z_]+$"},
        "type": {"enum": ["datasource", "query"]},
    },
    "if": {"properties": {"type": {"const": "query"}}},
    "then": {
        "required": ["query", "datasource"],
        "properties": {
            "query": {"type": "string", "pattern": r"^label_values\(.+, \w+\)$"},
            "datasource": {"const": DATASOURCE},
        },
    },
    "else": {"properties": {"query": {"const": "prometheus"}}},
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time", "tags"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "time": {"type": "object", "required": ["from", "to"]},
        "tags": {"type": "array", "contains": {"const": "inference-lifecycle"}},
        "panels": {"type": "array", "minItems": 1, "items": _PANEL},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": _VARIABLE}},
        },
        "annotations": {
            "type": "object",
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"datasource": {"const": DATASOURCE}},
                    },
                }
            },
        },
        "id": {"type": "null"},  # an exported id would clash on import
    },
}


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair anywhere in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def exprs(doc: dict[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard: panel queries and annotations."""
    return [value for key, value in walk(doc) if key == "expr"]


def variable_queries(doc: dict[str, Any]) -> list[str]:
    """The series selector inside each label_values(selector, label) variable query."""
    out = []
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            out.append(v["query"].removeprefix("label_values(").rsplit(",", 1)[0])
    return out


def test_two_dashboards_exist():
    assert [p.name for p in DASHBOARDS] == ["inference-cold-start.json", "inference-fleet.json"]


def test_committed_json_is_what_the_generator_renders():
    result = subprocess.run(
        [sys.executable, "tools/render_dashboards.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_matches_the_schema(path):
    jsonschema.validate(load(path), SCHEMA, cls=jsonschema.Draft202012Validator)


def test_schema_rejects_what_grafana_would_reject():
    good = load(DASHBOARDS[0])
    bad_variants = [
        {**good, "uid": "Has Spaces"},
        {**good, "panels": [{**good["panels"][1], "gridPos": {"h": 4, "w": 30, "x": 0, "y": 0}}]},
        {**good, "panels": [{**good["panels"][1], "datasource": {"uid": "P1809F7CD0C75ACF3"}}]},
        {**good, "panels": [{**good["panels"][1], "targets": []}]},
    ]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for bad in bad_variants:
        assert not validator.is_valid(bad)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_no_datasource_uid_is_hard_coded(path):
    refs = [value for key, value in walk(load(path)) if key == "datasource"]
    assert refs
    assert all(ref == DATASOURCE for ref in refs), {json.dumps(r) for r in refs} - {
        json.dumps(DATASOURCE)
    }


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_template_variables_and_every_query_uses_them(path):
    doc = load(path)
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "deployment", "instance", "target"]
    for expr in exprs(doc):
        assert "$instance" in expr or "$deployment" in expr, expr


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panel_ids_are_unique_and_panels_do_not_overlap(path):
    panels = load(path)["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboards_use_only_metrics_the_exporter_exposes(path):
    doc = load(path)
    used = {name for expr in exprs(doc) + variable_queries(doc) for name in metric_names(expr)}
    assert len(used) >= 8
    assert used - (golden_names() | recorded_names() | PROMETHEUS_SERIES) == set()


def test_cold_start_dashboard_shows_what_the_issue_asks_for():
    used = {
        name
        for expr in exprs(load(ROOT / "grafana/inference-cold-start.json"))
        for name in metric_names(expr)
    }
    asked = {
        "inference_server_phase",  # phase state timeline
        "inference_server_load_progress_ratio",
        "inference_server_eta_seconds",
        "inference_server_gpu_memory_used_bytes",  # GPU memory per GPU
        "inference_gpu_foreign_memory_used_bytes",
        "inference_gpu_pcie_rx_bytes_per_second",
        "inference_host_disk_read_bytes_total",
        "inference_server_process_read_bytes_total",
        "inference_server_process_resident_memory_bytes",
        "inference_server_probe_duration_seconds",
        "inference_server_probe_success",
        "inference_server_stalled",
        "inference_server_log_lines_total",
        "inference_server_last_cold_start_duration_seconds",  # this start against previous
    }
    assert asked - used == set()


def test_fleet_dashboard_shows_what_the_issue_asks_for():
    text = " ".join(exprs(load(ROOT / "grafana/inference-fleet.json")))
    assert "sum by (phase) (inference_server_phase" in text
    assert "histogram_quantile(0.5, sum by (le, deployment, model)" in text
    assert "histogram_quantile(0.95, sum by (le, deployment, model)" in text
    assert "inference_server_restarts_total" in text
    assert "deployment:inference_server_ready:ratio" in text


def test_provisioning_examples_point_at_prometheus_and_the_dashboards():
    prov = ROOT / "grafana/provisioning"
    ds = yaml.safe_load((prov / "datasources/inference-prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    boards = yaml.safe_load((prov / "dashboards/inference-lifecycle.yml").read_text())
    provider = boards["providers"][0]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")
