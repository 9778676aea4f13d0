"""Real processes for end-to-end tests: the simulator and the exporter, on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter_tooling.processes import free_port
from exporter_tooling.processes import stop_process as stop
from exporter_tooling.simulate.launcher import (
    SimulatorFiles,
    SimulatorSpec,
    ready_time,
    simulator_argv,
)

__all__ = [
    "ROOT",
    "Exporter",
    "Simulator",
    "exporter",
    "free_port",
    "simulated_nvml",
    "simulator",
    "stop",
]
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Simulator:
    """A ``simulate`` process (started by ``launch()``) and the files it writes."""

    port: int
    files: SimulatorFiles
    command: list[str]
    proc: subprocess.Popen[str] | None = None

    @property
    def work(self) -> Path:
        return self.files.directory

    @property
    def log_file(self) -> Path:
        return self.files.log_file

    @property
    def pid_file(self) -> Path:
        return self.files.pid_file

    @property
    def gpu_state(self) -> Path:
        return self.files.gpu_state

    def launch(self) -> None:
        """Start the simulator process."""
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def ready_at(self, timeout: float = 60.0) -> float:
        """Block until the simulator prints its ready line; return its ready time."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if (ready := ready_time(line)) is not None:
                return ready
            if not line and self.proc.poll() is not None:
                break
        raise AssertionError("simulator never became ready")

    def main_pid(self, timeout: float = 10.0) -> int:
        """The pid the simulator wrote to its pid file."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return int(self.pid_file.read_text())
            time.sleep(0.05)
        raise AssertionError("simulator wrote no pid file")


@contextlib.contextmanager
def simulator(
    work: Path,
    *,
    scenario: str = "healthy",
    engine: str = "sglang",
    weights_mb: int = 16,
    read_mbps: float = 8.0,
    start_seconds: float = 1.0,
    init_seconds: float = 1.5,
    gpus: int = 2,
    extra: list[str] | None = None,
    launch: bool = True,
) -> Iterator[Simulator]:
    """A simulator on a free port; with ``launch=False`` call ``sim.launch()`` yourself, e.g.
    once an exporter already watches its port, so the whole cold start is seen."""
    port = free_port()
    files = SimulatorFiles(work / f"sim-{port}").create()
    spec = SimulatorSpec(
        port=port,
        scenario=scenario,
        engine=engine,
        weights_mb=weights_mb,
        read_mbps=read_mbps,
        start_seconds=start_seconds,
        init_seconds=init_seconds,
        gpus=gpus,
        extra=tuple(extra or ()),
    )
    sim = Simulator(port, files, simulator_argv(spec, files))
    if launch:
        sim.launch()
    try:
        yield sim
    finally:
        if sim.proc is not None:
            stop(sim.proc)
            if sim.proc.stdout:
                sim.proc.stdout.close()


def target_toml(
    name: str,
    sim: Simulator,
    *,
    engine: str = "sglang",
    stall: str = "",
    completion: bool = True,
    interval: float = 0.25,
) -> str:
    text = f"""
[[target]]
name = "{name}"
engine = "{engine}"
base_url = "http://127.0.0.1:{sim.port}"
probe_timeout = "{interval * 0.8:.3f}s"
pidfile = "{sim.pid_file}"
log_file = "{sim.log_file}"
model_path = "{sim.files.weights}"
"""
    if completion:
        text += f'[target.completion]\nmodel = "m"\ninterval = "{interval * 2:.3f}s"\n'
    if stall:
        text += f"[target.stall]\n{stall}\n"
    return text


@dataclass
class Exporter:
    """A running exporter process."""

    proc: subprocess.Popen[str]
    port: int
    stderr_path: Path
    transitions: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 2.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read()

    def status(self) -> dict[str, Any]:
        return json.loads(self.get("/status"))

    def target(self, name: str) -> dict[str, Any]:
        return next(t for t in self.status()["targets"] if t["target"] == name)

    def metrics(self) -> str:
        return self.get("/metrics").decode()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], name: str, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Poll /status until predicate(target) holds; return that target's document."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, ConnectionError, StopIteration):
                last = self.target(name)
                if predicate(last):
                    return last
            time.sleep(0.05)
        raise AssertionError(f"timed out; last status of {name}: {json.dumps(last)[:2000]}")

    def log_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@contextlib.contextmanager
def exporter(
    work: Path,
    targets_toml: str,
    *,
    interval: float = 0.25,
    env: dict[str, str] | None = None,
    extra_exporter: str = "",
    args: list[str] | None = None,
    state: Path | None = None,
) -> Iterator[Exporter]:
    port = free_port()
    state = state or work / f"state-{port}"
    config = work / f"config-{port}.toml"
    config.write_text(
        f'[exporter]\ninterval = "{interval}s"\nstate_directory = "{state}"\n'
        f"{extra_exporter}\n{targets_toml}"
    )
    stderr_path = work / f"exporter-{port}.log"
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "run",
                "--config.file",
                str(config),
                "--web.listen-address",
                f"127.0.0.1:{port}",
                *(args or []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
    exp = Exporter(proc, port, stderr_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                exp.get("/-/ready")  # 503 (an HTTPError) until the first tick is done
                break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert proc.poll() is None, exp.log_text()
            time.sleep(0.05)
        yield exp
    finally:
        stop(proc)


def simulated_nvml(state: Path, library_dir: Path) -> dict[str, Any]:
    """``exporter``'s keyword arguments to read GPUs from the simulated libnvidia-ml.so.1 in
    ``library_dir`` (the ``nvml_dir`` fixture), which serves the GPUs ``state`` holds."""
    return {
        "env": {"SIMULATED_NVML_STATE": str(state)},
        "extra_exporter": f'nvml_library_dir = "{library_dir}"',
    }
