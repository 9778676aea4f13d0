"""What every section of a bench run shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exporter_tooling.bench.sizes import Sizes
from exporter_tooling.bench.stand_ins import Farm, HealthServer


@dataclass
class BenchContext:
    """Sizes, the work directory, the idle farm, the health endpoint and the NVML library."""

    sizes: Sizes
    work: Path
    farm: Farm
    health: HealthServer
    nvml_dir: Path
    node_exporter: str
    profile_dir: Path | None = None
    profiles: dict[str, str] = field(default_factory=dict)
    counter: int = 0

    def next_dir(self, name: str) -> Path:
        """A fresh directory for one exporter or simulator run."""
        self.counter += 1
        path = self.work / f"{self.counter:02d}-{name}"
        path.mkdir(parents=True)
        return path
