"""The real Prometheus and Alertmanager on loopback, for the tests that run them.

Both start the same way: the Debian binary, its log in the test's folder, a wait on its
``/-/ready`` while it is alive, and a stop however the test ends (``_ready_binary``).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.integration.harness import ROOT, free_port, stop


class Prometheus:
    """A running Prometheus and the few API calls the tests need."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:  # 400 for a query that does not parse
            body = json.load(exc)
            exc.close()
        assert body["status"] == "success", f"{params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> Any:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float) -> Any:
        end = time.time()
        start = end - math.ceil(end - start)  # on the step grid, so the last step is "now"
        return self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1"
        )["result"]

    def wait_for(self, expr: str, what: str, timeout: float = 40.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with_data = self.query(expr)
            if with_data:
                return with_data
            assert self.proc.poll() is None, "prometheus exited"
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}: {expr}")


def fast_rules(out: Path) -> list[Path]:
    """The repository's rule files with every ``for:`` cut to 1 s."""
    paths = []
    for name in ("alerts.yml", "rules.yml"):
        doc = yaml.safe_load((ROOT / "deploy/prometheus" / name).read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "1s"
        paths.append(out / name)
        paths[-1].write_text(yaml.safe_dump(doc))
    return paths


@contextmanager
def prometheus(
    work: Path,
    target: str,
    *,
    rules: list[Path] | None = None,
    alertmanager: str | None = None,
    scrape: str = "1s",
) -> Iterator[Prometheus]:
    """Prometheus scraping ``target`` every ``scrape`` and evaluating ``rules`` (default:
    ``fast_rules``) every second; its alerts go to ``alertmanager`` (host:port) when given."""
    rules = fast_rules(work) if rules is None else rules
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape, "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {"job_name": "inference-lifecycle-exporter", "static_configs": [{"targets": [target]}]}
        ],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    with _ready_binary(
        work / "prometheus.log",
        ("prometheus",),
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'tsdb'}",
    ) as (proc, url):
        yield Prometheus(proc, url)


@contextmanager
def alertmanager(work: Path, config: dict[str, Any]) -> Iterator[str]:
    """Alertmanager running ``config``; yields its host:port."""
    path = work / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    with _ready_binary(
        work / "alertmanager.log",
        ("prometheus-alertmanager", "alertmanager"),
        f"--config.file={path}",
        f"--storage.path={work / 'am-data'}",
        "--cluster.listen-address=",  # no gossip port: a single instance
    ) as (_proc, url):
        yield url.removeprefix("http://")


@contextmanager
def _ready_binary(
    log: Path, names: tuple[str, ...], *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The first of ``names`` found (Debian's, then upstream's) on a free loopback port,
    once its ``/-/ready`` answers; the first name is the Debian package."""
    binary = next(filter(None, map(shutil.which, names)), f"/usr/bin/{names[0]}")
    name = names[-1]
    assert Path(binary).exists(), f"{name} missing: apt-get install -y {names[0]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, *args, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2):
                    break
            except OSError:  # refused, or not ready yet (an HTTP 503 is an OSError too)
                assert time.monotonic() < deadline, f"{name} never became ready"
                time.sleep(0.1)
        yield proc, url
    finally:
        stop(proc)
