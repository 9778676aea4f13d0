"""The kubelet's probe rules, emulated against real processes, on a scaled clock.

Follows the documented rules (kubernetes.io, "Configure Liveness, Readiness and Startup
Probes"): an httpGet probe succeeds on a status from 200 to 399 and fails on any other, a
refused connection or a timeout; the startup probe runs alone until its first success, and
``failureThreshold`` failures in a row restart the container; then the liveness probe
(``failureThreshold`` failures in a row restart) and the readiness probe (ready after
``successThreshold`` successes, unready after ``failureThreshold`` failures; not ready at
first) run every ``periodSeconds``. A container whose process exits is restarted too
(``restartPolicy: Always``). Seconds from the manifest are multiplied by ``scale``.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def manifest_in(readme: str, heading: str, renames: Mapping[str, str]) -> dict[str, Any]:
    """The first yaml block under ``heading`` in the README, as the probes it sets, with each
    of ``renames`` replaced."""
    section = readme[readme.index(heading) :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, f"no yaml block under {heading}"
    text = block.group(1)
    for old, new in renames.items():
        text = text.replace(old, new)
    return yaml.safe_load(text)


@dataclass
class Probe:
    """One probe of a container spec and its running counts."""

    kind: str
    url: str
    period: float
    failure_threshold: int
    success_threshold: int
    timeout: float
    next_at: float = 0.0
    failures: int = 0
    successes: int = 0

    def check(self) -> bool:
        """One httpGet: a 2xx or 3xx status is success."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as reply:
                return 200 <= reply.status < 400
        except urllib.error.HTTPError as exc:
            return 200 <= exc.code < 400
        except OSError:
            return False


@dataclass
class Kubelet:
    """Runs one container's probes; ``restart`` kills and starts the container again.

    ``ports`` maps a manifest's port to the loopback port where that server really listens.
    """

    spec: Mapping[str, Any]
    ports: Mapping[int, int]
    restart: Callable[[], None]
    alive: Callable[[], bool]
    scale: float
    restarts: list[tuple[float, str]] = field(default_factory=list)
    ready_since: float | None = None
    #: Every readiness change: (time, ready).
    readiness: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._begin(time.monotonic())

    def _probe(self, kind: str, now: float) -> Probe | None:
        spec = self.spec.get(kind)
        if spec is None:
            return None
        get = spec["httpGet"]
        port = self.ports[int(get["port"])]
        return Probe(
            kind=kind,
            url=f"http://127.0.0.1:{port}{get.get('path', '/')}",
            period=spec.get("periodSeconds", 10) * self.scale,
            failure_threshold=spec.get("failureThreshold", 3),
            success_threshold=spec.get("successThreshold", 1),
            timeout=min(spec.get("timeoutSeconds", 1), spec.get("periodSeconds", 10) * self.scale),
            next_at=now + spec.get("initialDelaySeconds", 0) * self.scale,
        )

    def _begin(self, now: float) -> None:
        """A container (re)started: the startup probe alone, not ready."""
        self._probes = {k: p for k in PROBES if (p := self._probe(k, now)) is not None}
        self._started = "startupProbe" not in self._probes
        self._set_ready(False, now)

    def _set_ready(self, ready: bool, now: float) -> None:
        if not self.readiness or self.readiness[-1][1] != ready:
            self.readiness.append((now, ready))
        self.ready_since = (self.ready_since or now) if ready else None

    def run_for(self, seconds: float, until: Callable[[Kubelet], bool] = lambda k: False) -> None:
        """Probe for ``seconds`` (wall clock), or until ``until(self)`` holds."""
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end and not until(self):
            if not self.alive():
                self._restart(now, "exited")
                continue
            for kind in PROBES:
                probe = self._probes.get(kind)
                if probe is None or now < probe.next_at or not self._active(kind):
                    continue
                probe.next_at = now + probe.period
                self._count(probe, probe.check(), now)
            time.sleep(0.02)

    def _active(self, kind: str) -> bool:
        return (kind == "startupProbe") != self._started

    def _count(self, probe: Probe, ok: bool, now: float) -> None:
        probe.failures, probe.successes = (
            (0, probe.successes + 1) if ok else (probe.failures + 1, 0)
        )
        if probe.kind == "startupProbe":
            if ok:
                self._started = True
                for later in self._probes.values():
                    later.next_at = now  # liveness and readiness begin at once
            elif probe.failures >= probe.failure_threshold:
                self._restart(now, "startup")
        elif probe.kind == "livenessProbe" and probe.failures >= probe.failure_threshold:
            self._restart(now, "liveness")
        elif probe.kind == "readinessProbe":
            if ok and probe.successes >= probe.success_threshold:
                self._set_ready(True, now)
            elif not ok and probe.failures >= probe.failure_threshold:
                self._set_ready(False, now)

    def _restart(self, now: float, why: str) -> None:
        self.restarts.append((now, why))
        self.restart()
        self._begin(time.monotonic())
