"""TOML config file -> validated, frozen Settings.

Order as in blackbox_exporter: apply defaults, reject unknown keys and wrong types, then check
fields against each other. Every problem is reported as ``file: field: reason``; all of them
are collected before raising, so one run of ``check-config`` lists everything.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from exporter.core.model import Phase
from exporter.engines import ENGINES
from exporter.engines.profile import LogPatterns
from exporter.errors import ConfigError, ConfigErrors

DEFAULT_INTERVAL_SECONDS: Final = 1.0
DEFAULT_STATE_DIRECTORY: Final = "/var/lib/inference-lifecycle-exporter"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_\-\[\]]+$")
_LABEL_SAFE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?!s))?\s*"
    r"(?:(\d+(?:\.\d+)?)s)?\s*(?:(\d+(?:\.\d+)?)ms)?\s*$"
)


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

    def for_phase(self, phase: Phase) -> float | None:
        """The configured threshold of a startup phase, or None."""
        return {
            Phase.STARTING: self.starting,
            Phase.LOADING: self.loading,
            Phase.INITIALIZING: self.initializing,
        }.get(phase)


@dataclass(frozen=True, slots=True)
class Target:
    """One watched inference server."""

    name: str
    engine: str
    base_url: str
    health_path: str
    probe_timeout_seconds: float
    completion: CompletionProbe | None = None
    unit: str | None = None
    pidfile: str | None = None
    cmdline: str | None = None
    log_file: str | None = None
    journal: bool = False
    model_path: str | None = None
    gpus: tuple[int, ...] | None = None
    deployment: str = ""
    model: str = ""
    api_key_file: str | None = None
    api_key_env: str | None = None
    stall: StallThresholds = field(default_factory=StallThresholds)
    log_patterns: LogPatterns = field(default_factory=LogPatterns)

    @property
    def health_url(self) -> str:
        """Full URL of the readiness endpoint."""
        return self.base_url.rstrip("/") + self.health_path

    @property
    def port(self) -> int:
        """TCP port of base_url (scheme default when absent)."""
        parts = urlsplit(self.base_url)
        return parts.port or (443 if parts.scheme == "https" else 80)


@dataclass(frozen=True, slots=True)
class Settings:
    """The whole validated config file."""

    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    state_directory: str = DEFAULT_STATE_DIRECTORY
    targets: tuple[Target, ...] = ()
    source_path: str = ""
    nvml: bool = True
    nvml_library_dir: str | None = None


def parse_duration(value: object) -> float:
    """Seconds from a number or a Prometheus-style duration ("1m30s", "500ms", "2h").

    Raises:
        ValueError: the value is not a non-negative duration.
    """
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 10s or 1m30s")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("must not be negative")
        return float(value)
    if isinstance(value, str) and value.strip():
        m = _DURATION.match(value)
        if m and any(m.groups()):
            h, mi, s, ms = (float(g) if g else 0.0 for g in m.groups())
            return h * 3600 + mi * 60 + s + ms / 1000
    raise ValueError(f"{value!r} is not a duration such as 10s or 1m30s")


class _Reader:
    """Reads one TOML table, collecting problems instead of stopping at the first."""

    def __init__(
        self, path: str, errors: list[ConfigError], where: str, table: Mapping[str, Any]
    ) -> None:
        self.path, self.errors, self.where, self.table = path, errors, where, table
        self.seen: set[str] = set()

    def _field(self, key: str) -> str:
        # A key from the file may hold anything; quote odd ones so an error stays one line.
        shown = key if _BARE_KEY.match(key) else repr(key)
        return f"{self.where}.{shown}" if self.where else shown

    def fail(self, key: str, reason: str) -> None:
        """Record a problem with one key of this table."""
        self.errors.append(ConfigError(self.path, self._field(key), reason))

    def get(
        self,
        key: str,
        kind: type | tuple[type, ...],
        default: Any = None,
        *,
        required: bool = False,
    ) -> Any:
        """The value of key if it has the expected type, else record a problem."""
        self.seen.add(key)
        if key not in self.table:
            if required:
                self.fail(key, "is required")
            return default
        value = self.table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            self.fail(key, f"must be {_kind_name(kinds)}, not a boolean")
            return default
        if not isinstance(value, kinds):
            self.fail(key, f"must be {_kind_name(kinds)}, not {_toml_type(value)}")
            return default
        return value

    def duration(self, key: str, default: float | None) -> float | None:
        """A duration key (number of seconds or "1m30s")."""
        self.seen.add(key)
        if key not in self.table:
            return default
        try:
            return parse_duration(self.table[key])
        except ValueError as exc:
            self.fail(key, str(exc))
            return default

    def check(self, key: str, value: Any, rule: Callable[[Any], str | None]) -> None:
        """Apply a rule that returns a reason when the value is wrong."""
        if value is not None and (reason := rule(value)):
            self.fail(key, reason)

    def reject_unknown(self) -> None:
        """Record every key that no one asked for."""
        for key in self.table:
            if key not in self.seen:
                self.fail(key, "unknown key")


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "a table",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _toml_type(value: object) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _check_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        return "scheme must be http or https"
    if not parts.hostname:
        return "must name a host"
    if parts.username or parts.password:
        return "must not carry credentials; use api_key_file"
    try:
        _ = parts.port
    except ValueError:
        return "has an invalid port"
    return None


def _check_path(value: str) -> str | None:
    return None if value.startswith("/") else "must start with /"


def _check_regex(value: str) -> str | None:
    try:
        re.compile(value)
    except re.error as exc:
        return f"is not a valid regular expression: {exc}"
    return None


def _read_completion(r: _Reader, value: Mapping[str, Any]) -> CompletionProbe | None:
    c = _Reader(r.path, r.errors, r._field("completion"), value)
    model = c.get("model", str, required=True)
    probe = CompletionProbe(
        model=model or "",
        prompt=c.get("prompt", str, "2+2="),
        max_tokens=c.get("max_tokens", int, 4),
        interval_seconds=c.duration("interval", 30.0) or 30.0,
        timeout_seconds=c.duration("timeout", 10.0) or 10.0,
    )
    c.check(
        "max_tokens",
        probe.max_tokens,
        lambda v: None if 1 <= v <= 64 else "must be between 1 and 64",
    )
    c.check("timeout", probe.timeout_seconds, lambda v: None if v > 0 else "must be above 0")
    c.reject_unknown()
    return probe if model else None


def _read_stall(r: _Reader, value: Mapping[str, Any]) -> StallThresholds:
    s = _Reader(r.path, r.errors, r._field("stall"), value)
    th = StallThresholds(
        starting=s.duration("starting", None),
        loading=s.duration("loading", None),
        initializing=s.duration("initializing", None),
    )
    s.reject_unknown()
    return th


def _read_patterns(r: _Reader, value: Mapping[str, Any]) -> LogPatterns:
    p = _Reader(r.path, r.errors, r._field("log"), value)
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("benign", "fatal", "markers"):
        items = p.get(key, list, [])
        good = []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                p.fail(f"{key}[{i}]", "must be a string")
            elif reason := _check_regex(item):
                p.fail(f"{key}[{i}]", reason)
            else:
                good.append(item)
        lists[key] = tuple(good)
    p.reject_unknown()
    return LogPatterns(**lists)


def _read_target(
    path: str, errors: list[ConfigError], index: int, table: Mapping[str, Any], interval: float
) -> Target | None:
    r = _Reader(path, errors, f"target[{index}]", table)
    n_errors = len(errors)
    name = r.get("name", str, required=True)
    r.check(
        "name",
        name,
        lambda v: (
            None if _LABEL_SAFE.match(v) else "must be 1-64 characters of letters, digits, _ . : -"
        ),
    )
    engine_name = r.get("engine", str, "openai")
    engine = ENGINES.get(engine_name)
    if engine is None:
        r.fail("engine", f"unknown engine {engine_name!r}; known: {', '.join(ENGINES)}")
    base_url = r.get("base_url", str, required=True)
    r.check("base_url", base_url, _check_url)
    health_path = r.get("health_path", str, engine.health_path if engine else "/health")
    r.check("health_path", health_path, _check_path)
    timeout = r.duration("probe_timeout", min(2.0, interval * 0.8))
    r.check(
        "probe_timeout",
        timeout,
        lambda v: (
            None if 0 < v < interval else f"must be above 0 and below the interval ({interval:g}s)"
        ),
    )
    completion_table = r.get("completion", dict)
    finders = {k: r.get(k, str) for k in ("unit", "pidfile", "cmdline")}
    r.check("cmdline", finders["cmdline"], _check_regex)
    r.check(
        "pidfile",
        finders["pidfile"],
        lambda v: None if v.startswith("/") else "must be an absolute path",
    )
    given = [k for k, v in finders.items() if v]
    if len(given) > 1:
        r.fail(given[1], f"conflicts with {given[0]}: use one of unit, pidfile, cmdline")
    log_file = r.get("log_file", str)
    journal = r.get("journal", bool, bool(finders["unit"]) and not log_file)
    if journal and not finders["unit"]:
        r.fail("journal", "needs unit to know which journal entries are this server's")
    gpus = r.get("gpus", list)
    if gpus is not None and not all(isinstance(g, int) and g >= 0 for g in gpus):
        r.fail("gpus", "must be a list of GPU indices (integers >= 0)")
        gpus = None
    api_key_file = r.get("api_key_file", str)
    api_key_env = r.get("api_key_env", str)
    if api_key_file and api_key_env:
        r.fail("api_key_env", "conflicts with api_key_file: use one")
    deployment = r.get("deployment", str, "")
    model = r.get("model", str, "")
    model_path = r.get("model_path", str)
    stall_table = r.get("stall", dict, {})
    log_table = r.get("log", dict, {})
    completion = _read_completion(r, completion_table) if completion_table else None
    stall = _read_stall(r, stall_table)
    patterns = _read_patterns(r, log_table)
    r.reject_unknown()
    if len(errors) > n_errors or engine is None:
        return None
    return Target(
        name=name,
        engine=engine_name,
        base_url=base_url,
        health_path=health_path,
        probe_timeout_seconds=timeout or 1.0,
        completion=completion,
        unit=finders["unit"],
        pidfile=finders["pidfile"],
        cmdline=finders["cmdline"],
        log_file=log_file,
        journal=journal,
        model_path=model_path,
        gpus=tuple(gpus) if gpus is not None else None,
        deployment=deployment,
        model=model,
        api_key_file=api_key_file,
        api_key_env=api_key_env,
        stall=stall,
        log_patterns=patterns,
    )


def parse_settings(data: Mapping[str, Any], path: str) -> Settings:
    """Validate parsed TOML; ``path`` only names the file in error messages.

    Raises:
        ConfigErrors: one entry per problem found.
    """
    errors: list[ConfigError] = []
    top = _Reader(path, errors, "", data)
    exporter_table = top.get("exporter", dict, {})
    target_tables = top.get("target", list, [])
    top.reject_unknown()
    ex = _Reader(path, errors, "exporter", exporter_table)
    interval = ex.duration("interval", DEFAULT_INTERVAL_SECONDS) or DEFAULT_INTERVAL_SECONDS
    ex.check(
        "interval", interval, lambda v: None if 0.1 <= v <= 300 else "must be between 100ms and 5m"
    )
    state_dir = ex.get("state_directory", str, DEFAULT_STATE_DIRECTORY)
    nvml = ex.get("nvml", bool, True)
    nvml_library_dir = ex.get("nvml_library_dir", str)
    ex.reject_unknown()
    targets: list[Target] = []
    names: dict[str, int] = {}
    for i, table in enumerate(target_tables):
        if not isinstance(table, dict):
            errors.append(ConfigError(path, f"target[{i}]", "must be a table ([[target]])"))
            continue
        target = _read_target(path, errors, i, table, interval)
        if target is None:
            continue
        if target.name in names:
            errors.append(
                ConfigError(
                    path,
                    f"target[{i}].name",
                    f"duplicate name {target.name!r} (also target[{names[target.name]}])",
                )
            )
            continue
        names[target.name] = i
        targets.append(target)
    if errors:
        raise ConfigErrors(errors)
    return Settings(
        interval_seconds=interval,
        state_directory=state_dir,
        targets=tuple(targets),
        source_path=path,
        nvml=nvml,
        nvml_library_dir=nvml_library_dir,
    )


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
