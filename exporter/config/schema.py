"""The validated config as frozen values: ``Settings``, its ``Target``s and discovery tables.

Plain data and the defaults; reading and checking the TOML is ``reader``'s (and the modules it
calls), so everything that only needs the shape imports this alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from exporter.base.model import Phase
from exporter.engines import ENGINES, Engine
from exporter.engines.profile import LogPatterns

DEFAULT_INTERVAL_SECONDS: Final = 1.0
DEFAULT_STATE_DIRECTORY: Final = "/var/lib/inference-lifecycle-exporter"


@dataclass(frozen=True, slots=True)
class CompletionProbe:
    """A periodic ``/v1/completions`` request proving the server really serves."""

    model: str
    prompt: str = "2+2="
    max_tokens: int = 4
    interval_seconds: float = 30.0
    timeout_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class StallThresholds:
    """Seconds without progress evidence before a startup phase is flagged stalled.

    None means: learn it from history, falling back to the built-in default.
    """

    starting: float | None = None
    loading: float | None = None
    initializing: float | None = None
    downloading: float | None = None

    def for_phase(self, phase: Phase) -> float | None:
        """The configured threshold of a startup phase, or None."""
        return {
            Phase.STARTING: self.starting,
            Phase.DOWNLOADING: self.downloading,
            Phase.LOADING: self.loading,
            Phase.INITIALIZING: self.initializing,
        }.get(phase)


@dataclass(frozen=True, slots=True)
class PodRef:
    """Where a discovered target runs in Kubernetes: ``inference_server_info`` labels only."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class Target:
    """One watched inference server.

    ``container_id`` names the container whose cgroup holds the server; a discovered
    container not created yet has ``""`` (nothing is found until the runtime reports it).
    ``history_key`` is where ETAs and thresholds are learned from, when not the name.
    ``engine`` is the engine's name (labels, JSON); ``profile`` is that engine resolved once,
    here, so no source looks it up by string again.
    """

    name: str
    engine: str
    base_url: str
    health_path: str
    probe_timeout_seconds: float
    completion: CompletionProbe | None = None
    unit: str | None = None
    pidfile: str | None = None
    cmdline: str | None = None
    container_id: str | None = None
    log_file: str | None = None
    journal: bool = False
    model_path: str | None = None
    #: GPU indices, GPU UUIDs (``GPU-...``) or MIG device UUIDs (``MIG-...``); None: all.
    gpus: tuple[int | str, ...] | None = None
    deployment: str = ""
    model: str = ""
    api_key_file: str | None = None
    api_key_env: str | None = None
    history_key: str = ""
    pod: PodRef | None = None
    stall: StallThresholds = field(default_factory=StallThresholds)
    log_patterns: LogPatterns = field(default_factory=LogPatterns)
    profile: Engine = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        engine = ENGINES.get(self.engine)
        if engine is None:
            raise ValueError(f"unknown engine {self.engine!r}; known: {', '.join(ENGINES)}")
        object.__setattr__(self, "profile", engine)

    @property
    def history_name(self) -> str:
        """The name its finished starts are kept under: shared by a workload's replicas."""
        return self.history_key or self.name

    @property
    def health_url(self) -> str:
        """Full URL of the readiness endpoint."""
        return self.base_url.rstrip("/") + self.health_path

    @property
    def port(self) -> int:
        """TCP port of base_url (scheme default when absent)."""
        parts = urlsplit(self.base_url)
        return parts.port or (443 if parts.scheme == "https" else 80)


class PodSelection(enum.StrEnum):
    """Which containers of the node's pods become targets."""

    #: Pods carrying the ``inference-lifecycle.io/engine`` annotation or label.
    ANNOTATED = "annotated"
    #: Those, and containers whose image or command names an engine's server.
    ANNOTATED_OR_IMAGE = "annotated_or_image"


#: Placeholders of ``[discovery.kubernetes] name_template``.
NAME_PLACEHOLDERS: Final = ("namespace", "pod", "container")
#: What a pod's name template must hold: pod names repeat across namespaces.
UNIQUE_NAME_PLACEHOLDERS: Final = ("namespace", "pod")
#: Discovered targets kept at most: a GPU node runs a few engines; thousands of pods would
#: cost seconds a scrape and the chart's memory limit (``max_targets`` changes it).
DEFAULT_MAX_TARGETS: Final = 64
#: Placeholders of ``[discovery.docker] name_template``.
DOCKER_NAME_PLACEHOLDERS: Final = ("container", "service", "project")
#: The Docker Engine's socket; Podman's (``/run/podman/podman.sock``) speaks the same API.
DEFAULT_DOCKER_SOCKET: Final = "/var/run/docker.sock"


@dataclass(frozen=True, slots=True)
class KubernetesDiscovery:
    """``[discovery.kubernetes]``: targets from the pods of one node, watched on the API server.

    ``kubeconfig`` None means in-cluster credentials (the pod's service account).
    ``grace_seconds`` is how long a gone pod's targets keep exporting their final state.
    """

    node_name: str
    kubeconfig: str | None = None
    name_template: str = "{namespace}/{pod}"
    select: PodSelection = PodSelection.ANNOTATED
    grace_seconds: float = 300.0
    probe_timeout_seconds: float = 0.8
    max_targets: int = DEFAULT_MAX_TARGETS


@dataclass(frozen=True, slots=True)
class DockerDiscovery:
    """``[discovery.docker]``: targets from this host's labelled Docker or Podman containers.

    ``grace_seconds`` is how long a gone container's targets keep exporting their final state.
    """

    socket: str = DEFAULT_DOCKER_SOCKET
    name_template: str = "{container}"
    grace_seconds: float = 300.0
    probe_timeout_seconds: float = 0.8
    max_targets: int = DEFAULT_MAX_TARGETS


#: ``gpu_health_metrics`` values. "problems" keeps a healthy host within the series budget
#: (STYLE.md: under 200 for two targets on eight GPUs); "all" adds 13 series per GPU.
GPU_HEALTH_METRICS: Final = ("problems", "all")


@dataclass(frozen=True, slots=True)
class Settings:
    """The whole validated config file."""

    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    state_directory: str = DEFAULT_STATE_DIRECTORY
    targets: tuple[Target, ...] = ()
    source_path: str = ""
    nvml: bool = True
    nvml_library_dir: str | None = None
    #: Watch AMD GPUs through amd-smi when its library is found (auto-detected).
    amdsmi: bool = True
    amdsmi_library_dir: str | None = None
    #: Which GPU health series to export: "problems" (a series while it shows one) or "all".
    gpu_health_metrics: str = "problems"
    kubernetes: KubernetesDiscovery | None = None
    docker: DockerDiscovery | None = None
