"""The config: a TOML file read into frozen ``Settings`` (``reader``), their shape (``schema``).

``targets`` and ``discovery`` read their tables through ``fields``; ``regex`` compiles the
user's patterns with RE2. The names every layer uses are re-exported here.
"""

from exporter.config.fields import parse_duration
from exporter.config.reader import (
    check_environment,
    load_settings,
    parse_settings,
    state_directory_problem,
)
from exporter.config.regex import UserRegex
from exporter.config.schema import (
    DEFAULT_DOCKER_SOCKET,
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_STATE_DIRECTORY,
    DOCKER_NAME_PLACEHOLDERS,
    GPU_HEALTH_METRICS,
    NAME_PLACEHOLDERS,
    CompletionProbe,
    DockerDiscovery,
    KubernetesDiscovery,
    PodRef,
    PodSelection,
    Settings,
    StallThresholds,
    Target,
)

__all__ = [
    "DEFAULT_DOCKER_SOCKET",
    "DEFAULT_INTERVAL_SECONDS",
    "DEFAULT_STATE_DIRECTORY",
    "DOCKER_NAME_PLACEHOLDERS",
    "GPU_HEALTH_METRICS",
    "NAME_PLACEHOLDERS",
    "CompletionProbe",
    "DockerDiscovery",
    "KubernetesDiscovery",
    "PodRef",
    "PodSelection",
    "Settings",
    "StallThresholds",
    "Target",
    "UserRegex",
    "check_environment",
    "load_settings",
    "parse_duration",
    "parse_settings",
    "state_directory_problem",
]
