"""Starting the simulator as a child process: its command line, its files and its ready line.

The one place that turns "a simulated engine on this port, doing this" into ``simulate`` flags;
the demo, the bench and the end-to-end tests all start the simulator through it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from exporter_tooling.simulate.plan import GPU_NAME

#: What the simulator prints on stdout once it is ready: ``SIMULATOR ready_at=<t> pid=<pid>``.
READY_PREFIX: Final = "SIMULATOR ready_at="


@dataclass(frozen=True, slots=True)
class SimulatorFiles:
    """Where one simulator writes, all inside ``directory`` (the exporter is pointed at them)."""

    directory: Path

    @property
    def log_file(self) -> Path:
        """The engine log it appends to."""
        return self.directory / "engine.log"

    @property
    def pid_file(self) -> Path:
        """Where it writes its main pid."""
        return self.directory / "engine.pid"

    @property
    def gpu_state(self) -> Path:
        """The fake NVML state file it publishes its GPUs to."""
        return self.directory / "gpus.state"

    @property
    def weights(self) -> Path:
        """The directory its weight files are created in (the target's ``model_path``)."""
        return self.directory / "weights"

    def create(self) -> SimulatorFiles:
        """Create the directory and its weights directory; returns ``self``."""
        self.weights.mkdir(parents=True, exist_ok=True)
        return self


@dataclass(frozen=True, slots=True)
class SimulatorSpec:
    """What the simulated engine does: the flags of one ``simulate`` run."""

    port: int
    scenario: str = "healthy"
    engine: str = "sglang"
    weights_mb: int = 16
    read_mbps: float = 8.0
    start_seconds: float = 1.0
    init_seconds: float = 1.5
    gpus: int = 2
    gpu_name: str = GPU_NAME
    extra: tuple[str, ...] = ()


def simulator_argv(spec: SimulatorSpec, files: SimulatorFiles) -> list[str]:
    """The command line that runs ``spec`` writing into ``files``, with this Python."""
    flags: dict[str, object] = {
        "--port": spec.port,
        "--engine": spec.engine,
        "--scenario": spec.scenario,
        "--weights-mb": spec.weights_mb,
        "--read-mbps": spec.read_mbps,
        "--start-seconds": spec.start_seconds,
        "--init-seconds": spec.init_seconds,
        "--gpus": spec.gpus,
        "--gpu-name": spec.gpu_name,
        "--gpu-state-file": files.gpu_state,
        "--log-file": files.log_file,
        "--pid-file": files.pid_file,
        "--work-dir": files.weights,
    }
    argv = [sys.executable, "-m", "exporter_tooling.simulate"]
    for flag, value in flags.items():
        argv += [flag, str(value)]
    return [*argv, *spec.extra]


def ready_time(line: str) -> float | None:
    """The unix time in the simulator's ready line; None for any other line."""
    if not line.startswith(READY_PREFIX):
        return None
    return float(line[len(READY_PREFIX) :].split(maxsplit=1)[0])
