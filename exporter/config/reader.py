"""TOML config file -> validated, frozen Settings.

Order as in blackbox_exporter: apply defaults, reject unknown keys and wrong types, then check
fields against each other. Every problem is reported as ``file: field: reason``; all of them
are collected before raising, so one run of ``check-config`` lists everything.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path

from exporter.base.errors import ConfigError, ConfigErrors
from exporter.config.discovery import read_docker, read_kubernetes
from exporter.config.fields import Table, check_file_path
from exporter.config.schema import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_STATE_DIRECTORY,
    GPU_HEALTH_METRICS,
    Settings,
)
from exporter.config.targets import read_targets


def _read_interval(ex: Table) -> float:
    """The loop interval; 0 is refused like any other value out of range, not defaulted."""
    interval = ex.duration("interval", DEFAULT_INTERVAL_SECONDS)
    if interval is None or not 0.1 <= interval <= 300:
        ex.check("interval", interval, lambda _: "must be between 100ms and 5m")
        return DEFAULT_INTERVAL_SECONDS  # only so the targets' checks can go on
    return interval


def parse_settings(
    data: Mapping[str, object], path: str, environ: Mapping[str, str] | None = None
) -> Settings:
    """Validate parsed TOML; ``path`` only names the file in error messages.

    ``environ`` (default: the process environment) gives defaults the file may leave out:
    ``NODE_NAME``, which a DaemonSet sets from the downward API.

    Raises:
        ConfigErrors: one entry per problem found.
    """
    errors: list[ConfigError] = []
    top = Table(path, errors, "", data)
    exporter_table = top.table_field("exporter")
    target_tables = top.list_field("target") or []
    discovery_table = top.table_field("discovery")
    top.reject_unknown()
    ex = top.sub("exporter", exporter_table)
    interval = _read_interval(ex)
    state_dir = ex.str_field("state_directory", DEFAULT_STATE_DIRECTORY)
    ex.check("state_directory", state_dir, check_file_path)
    nvml = ex.bool_field("nvml", True)
    nvml_library_dir = ex.optional_str("nvml_library_dir")
    ex.check("nvml_library_dir", nvml_library_dir, check_file_path)
    amdsmi = ex.bool_field("amdsmi", True)
    amdsmi_library_dir = ex.optional_str("amdsmi_library_dir")
    ex.check("amdsmi_library_dir", amdsmi_library_dir, check_file_path)
    gpu_health_metrics = ex.str_field("gpu_health_metrics", "problems")
    if gpu_health_metrics not in GPU_HEALTH_METRICS:
        ex.fail("gpu_health_metrics", f"must be one of {', '.join(GPU_HEALTH_METRICS)}")
    ex.reject_unknown()
    targets = read_targets(path, errors, target_tables, interval)
    discovery = top.sub("discovery", discovery_table)
    kubernetes_table = discovery.table_field("kubernetes")
    docker_table = discovery.table_field("docker")
    discovery.reject_unknown()
    kubernetes = (
        read_kubernetes(
            discovery.sub("kubernetes", kubernetes_table),
            interval,
            os.environ if environ is None else environ,
        )
        if isinstance(discovery_table.get("kubernetes"), dict)
        else None
    )
    docker = (
        read_docker(discovery.sub("docker", docker_table), interval)
        if isinstance(discovery_table.get("docker"), dict)
        else None
    )
    if errors:
        raise ConfigErrors(errors)
    return Settings(
        interval_seconds=interval,
        state_directory=state_dir,
        targets=targets,
        source_path=path,
        nvml=nvml,
        nvml_library_dir=nvml_library_dir,
        amdsmi=amdsmi,
        amdsmi_library_dir=amdsmi_library_dir,
        gpu_health_metrics=gpu_health_metrics,
        kubernetes=kubernetes,
        docker=docker,
    )


def state_directory_problem(directory: str) -> str | None:
    """Why the daemon could not keep its history in directory, or None.

    ``run`` would fall back to memory and lose history at every restart; ``check-config``
    says so before. An existing directory gets a real write probe (a temporary file, then
    removed): permission bits say nothing for root, a read-only mount does. A missing one
    needs its nearest existing ancestor to be a writable directory (``run`` creates it).
    """
    path = Path(directory)
    if path.is_dir():
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as exc:
            return f"is not writable: {exc.strerror or exc}"
        return None
    if path.exists() or path.is_symlink():
        return "exists and is not a directory"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be created: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be created: {ancestor} is not writable"
    return None


def check_environment(settings: Settings) -> list[ConfigError]:
    """What the host would refuse of a valid config: each problem as a ``ConfigError``.

    For ``check-config``; ``run`` degrades instead (history in memory) and reports it as the
    history source being down.
    """
    problems: list[ConfigError] = []
    if reason := state_directory_problem(settings.state_directory):
        problems.append(ConfigError(settings.source_path, "exporter.state_directory", reason))
    return problems


def load_settings(path: str | Path) -> Settings:
    """Read and validate a TOML config file.

    Raises:
        ConfigErrors: the file is missing, unreadable, not TOML, or has invalid fields.
    """
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigErrors([ConfigError(name, "", f"cannot read: {exc.strerror}")]) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigErrors([ConfigError(name, "", "is not UTF-8 text")]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors([ConfigError(name, "", f"invalid TOML: {exc}")]) from exc
    return parse_settings(data, name)
