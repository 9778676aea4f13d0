"""TOML config file -> validated, frozen Settings.

Order as in blackbox_exporter: apply defaults, reject unknown keys and wrong types, then check
fields against each other. Every problem is reported as ``file: field: reason``; all of them
are collected before raising, so one run of ``check-config`` lists everything.
"""

from __future__ import annotations

import enum
import os
import re
import stat
import string
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, TypeVar, cast
from urllib.parse import urlsplit

import httpx
import re2

from exporter.base.errors import ConfigError, ConfigErrors
from exporter.base.model import Phase
from exporter.engines import ENGINES, Engine
from exporter.engines.profile import LogPatterns, Matcher

DEFAULT_INTERVAL_SECONDS: Final = 1.0
DEFAULT_STATE_DIRECTORY: Final = "/var/lib/inference-lifecycle-exporter"
# Checked with fullmatch: "$" would let a trailing newline through (into a label value).
_BARE_KEY = re.compile(r"[A-Za-z0-9_\-\[\]]+")
_LABEL_SAFE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
_UUID: Final = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
#: A GPU UUID, a MIG device UUID (R470+), or the MIG-GPU-<uuid>/<gi>/<ci> form of R450 drivers.
_GPU_UUID = re.compile(rf"GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/\d{{1,2}}/\d{{1,2}}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# C0 and C1 controls and DEL: never meant in a URL, a path, a name or a label value.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_T = TypeVar("_T")
_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?!s))?\s*"
    r"(?:(\d+(?:\.\d+)?)s)?\s*(?:(\d+(?:\.\d+)?)ms)?\s*$"
)


class _Re2Pattern(Protocol):
    """What this module uses of a compiled ``re2`` pattern (the package ships no types)."""

    def search(self, text: str) -> object | None:
        """A match object or None."""
        ...


@dataclass(frozen=True, slots=True)
class UserRegex:
    """A regular expression from the config, compiled with RE2: matching is linear in the text.

    Python's ``re`` backtracks: ``(a+)+$`` against one long line of ``a`` holds the GIL for
    minutes, stopping scrapes and ``/-/healthy`` with the loop. RE2 has no backtracking, so
    it refuses what needs it (backreferences, lookarounds, possessive and atomic groups).
    Equal when the pattern and flags are (a reload compares targets).

    Raises:
        ValueError: with the reason, when RE2 cannot take the pattern.
    """

    pattern: str
    ignore_case: bool = False
    _compiled: _Re2Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        options = re2.Options()
        options.case_sensitive = not self.ignore_case
        options.log_errors = False  # RE2 would print each refusal to stderr itself
        try:
            compiled = re2.compile(self.pattern, options)
        except re2.error as exc:
            raise ValueError(_re2_refusal(self.pattern, exc)) from None
        object.__setattr__(self, "_compiled", cast(_Re2Pattern, compiled))

    def search(self, text: str) -> object | None:
        """A match object when the pattern occurs anywhere in text, else None."""
        return self._compiled.search(text)


def _re2_refusal(pattern: str, exc: Exception) -> str:
    why = exc.args[0] if exc.args else ""
    reason = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
    try:
        re.compile(pattern)
    except re.error as syntax:  # a plain mistake: Python's message says where
        return f"is not a valid regular expression: {syntax}"
    return (
        "needs backtracking (a backreference, lookaround, possessive or atomic group), refused: "
        f"one hostile line could freeze the exporter; RE2: {reason}"
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


@dataclass(frozen=True, slots=True)
class DockerDiscovery:
    """``[discovery.docker]``: targets from this host's labelled Docker or Podman containers.

    ``grace_seconds`` is how long a gone container's targets keep exporting their final state.
    """

    socket: str = DEFAULT_DOCKER_SOCKET
    name_template: str = "{container}"
    grace_seconds: float = 300.0
    probe_timeout_seconds: float = 0.8


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


class _Table:
    """One TOML table being read: typed accessors record a problem instead of stopping.

    Every accessor marks its key as seen (see ``reject_unknown``) and returns the type it
    names; a missing key gives the default, a mistyped one records ``must be ...`` and gives
    the default too, so reading goes on and one run reports every problem.
    """

    def __init__(
        self, path: str, errors: list[ConfigError], where: str, table: Mapping[str, object]
    ) -> None:
        self.path, self.errors, self.where, self.table = path, errors, where, table
        self.seen: set[str] = set()

    def field_name(self, key: str) -> str:
        """The dotted name of key in error messages (``target[0].completion``)."""
        # A key from the file may hold anything; quote odd ones so an error stays one line.
        shown = key if _BARE_KEY.fullmatch(key) else repr(key)
        return f"{self.where}.{shown}" if self.where else shown

    def fail(self, key: str, reason: str) -> None:
        """Record a problem with one key of this table."""
        self.errors.append(ConfigError(self.path, self.field_name(key), reason))

    def sub(self, key: str, table: Mapping[str, object]) -> _Table:
        """A reader for the nested table under key, reporting into the same list."""
        return _Table(self.path, self.errors, self.field_name(key), table)

    def _typed(self, key: str, kind: type[_T], *, required: bool = False) -> _T | None:
        self.seen.add(key)
        if key not in self.table:
            if required:
                self.fail(key, "is required")
            return None
        value = self.table[key]
        # bool is an int in Python, never in TOML: ``max_tokens = true`` is a mistake.
        if isinstance(value, bool) and kind is not bool:
            self.fail(key, f"must be {_KIND_NAMES[kind]}, not a boolean")
            return None
        if not isinstance(value, kind):
            self.fail(key, f"must be {_KIND_NAMES[kind]}, not {_toml_type(value)}")
            return None
        return value

    def required_str(self, key: str) -> str | None:
        """A string that must be present; None (and a problem recorded) otherwise."""
        return self._typed(key, str, required=True)

    def optional_str(self, key: str) -> str | None:
        """A string, or None when absent or mistyped."""
        return self._typed(key, str)

    def str_field(self, key: str, default: str) -> str:
        """A string with a default."""
        value = self._typed(key, str)
        return default if value is None else value

    def int_field(self, key: str, default: int) -> int:
        """An integer with a default."""
        value = self._typed(key, int)
        return default if value is None else value

    def bool_field(self, key: str, default: bool) -> bool:
        """A boolean with a default."""
        value = self._typed(key, bool)
        return default if value is None else value

    def table_field(self, key: str) -> Mapping[str, object]:
        """A nested table; empty when absent or mistyped."""
        value: Mapping[str, object] | None = self._typed(key, dict)
        return {} if value is None else value

    def list_field(self, key: str) -> list[object] | None:
        """A list of anything (the caller checks the items), or None when absent or mistyped."""
        value: list[object] | None = self._typed(key, list)
        return value

    def str_list(self, key: str, rule: Callable[[str], str | None]) -> tuple[str, ...]:
        """A list of strings, each passing rule; a bad item is reported as ``key[i]``."""
        good: list[str] = []
        for i, item in enumerate(self.list_field(key) or ()):
            if not isinstance(item, str):
                self.fail(f"{key}[{i}]", "must be a string")
            elif reason := rule(item):
                self.fail(f"{key}[{i}]", reason)
            else:
                good.append(item)
        return tuple(good)

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

    def check(self, key: str, value: _T | None, rule: Callable[[_T], str | None]) -> None:
        """Apply a rule that returns a reason when the value is wrong."""
        if value is not None and (reason := rule(value)):
            self.fail(key, reason)

    def reject_unknown(self) -> None:
        """Record every key that no one asked for."""
        for key in self.table:
            if key not in self.seen:
                self.fail(key, "unknown key")


_KIND_NAMES: Final[Mapping[type, str]] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "a table",
}


def _toml_type(value: object) -> str:
    return _KIND_NAMES.get(type(value), type(value).__name__)


def _check_text(value: str) -> str | None:
    r"""No control characters (a TOML escape such as \t or \n is one); shown escaped."""
    if m := _CONTROL.search(value):
        return f"must not contain control characters ({m.group()!r} at position {m.start()})"
    return None


def _check_word(value: str) -> str | None:
    """A name or URL: no control characters and no whitespace anywhere."""
    if reason := _check_text(value):
        return reason
    if m := re.search(r"\s", value):
        return f"must not contain whitespace ({m.group()!r} at position {m.start()})"
    return None


def _check_url(value: str) -> str | None:
    if reason := _check_word(value):
        return reason
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError as exc:  # "http://[" and "http://[zz]": urllib raises, not returns
        return f"is not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "scheme must be http or https"
    if not host:
        return "must name a host"
    if parts.username or parts.password:
        return "must not carry credentials; use api_key_file"
    try:
        port = parts.port
    except ValueError:
        return "has an invalid port"
    if port == 0:
        return "port must be between 1 and 65535"
    if parts.query or parts.fragment:
        return "must not carry a query or fragment"
    return _http_client_refusal(value, "/")


def _http_client_refusal(base_url: str, path: str) -> str | None:
    """Why the probes' HTTP client would refuse this URL, or None: built by httpx itself.

    urllib and httpx disagree at the edges (IDNA host names, IPv4 octets, what follows an
    IPv6 literal); a URL that passed here but not there killed the daemon at start or reload.
    Building the client opens nothing (about a millisecond).
    """
    try:
        with httpx.Client(base_url=base_url, trust_env=False, verify=False) as client:
            client.build_request("GET", path)
    except Exception as exc:  # InvalidURL, and idna's own errors, which httpx lets through
        return "is refused by the HTTP client: " + " ".join(str(exc).split())
    return None


def _check_log_file(value: str) -> str | None:
    """When it exists, a regular file (a FIFO or a device never ends)."""
    if not value.startswith("/"):
        return None  # _check_file_path says so
    try:
        mode = os.stat(value).st_mode
    except OSError:
        return None  # may appear later (the engine creates it): the source reports it then
    return None if stat.S_ISREG(mode) else "is not a regular file (a FIFO or a device?)"


def _check_path(value: str) -> str | None:
    if reason := _check_word(value):
        return reason
    return None if value.startswith("/") else "must start with /"


def _check_file_path(value: str) -> str | None:
    """A file system path: absolute (the daemon's working directory is nobody's choice)."""
    if reason := _check_text(value):
        return reason
    if value != value.strip():
        return "must not start or end with whitespace"
    return None if os.path.isabs(value) else "must be an absolute path"


def _check_unit(value: str) -> str | None:
    if reason := _check_word(value):
        return reason
    return "must be a unit name, not a path" if "/" in value else None


def _check_container_id(value: str) -> str | None:
    """A container ID as runtimes print it: 64 hex characters, or a unique prefix of 12 or more."""
    if _CONTAINER_ID.fullmatch(value):
        return None
    return "must be 12 to 64 lowercase hex characters (a container ID)"


def _check_env_name(value: str) -> str | None:
    if _ENV_NAME.fullmatch(value):
        return None
    return "must be an environment variable name (letters, digits and _)"


def _check_regex(value: str, *, ignore_case: bool = True) -> str | None:
    try:
        UserRegex(value, ignore_case)
    except ValueError as exc:
        return str(exc)
    return None


def _check_cmdline(value: str) -> str | None:
    return _check_regex(value, ignore_case=False)


def _above_zero(value: float) -> str | None:
    return None if value > 0 else "must be above 0"


def _read_completion(c: _Table) -> CompletionProbe | None:
    model = c.required_str("model")
    c.check("model", model, _check_text)
    # 0 is refused, not read as "the default": an interval of 0 would never be what was meant.
    interval, timeout = c.duration("interval", 30.0), c.duration("timeout", 10.0)
    c.check("interval", interval, _above_zero)
    c.check("timeout", timeout, _above_zero)
    probe = CompletionProbe(
        model=model or "",
        prompt=c.str_field("prompt", "2+2="),
        max_tokens=c.int_field("max_tokens", 4),
        interval_seconds=interval or 30.0,
        timeout_seconds=timeout or 10.0,
    )
    c.check("max_tokens", probe.max_tokens, _between(1, 64))
    c.reject_unknown()
    return probe if model else None


def _between(low: int, high: int) -> Callable[[int], str | None]:
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}"


def _read_stall(s: _Table) -> StallThresholds:
    th = StallThresholds(
        starting=s.duration("starting", None),
        loading=s.duration("loading", None),
        initializing=s.duration("initializing", None),
        downloading=s.duration("downloading", None),
    )
    s.reject_unknown()
    return th


def _read_patterns(p: _Table) -> LogPatterns:
    def compiled(key: str) -> tuple[Matcher, ...]:
        return tuple(UserRegex(r, ignore_case=True) for r in p.str_list(key, _check_regex))

    patterns = LogPatterns(
        benign=compiled("benign"), fatal=compiled("fatal"), markers=compiled("markers")
    )
    p.reject_unknown()
    return patterns


def _read_name(r: _Table) -> str | None:
    name = r.required_str("name")
    r.check("name", name, _check_label)
    return name


def _check_label(value: str) -> str | None:
    if _LABEL_SAFE.fullmatch(value):
        return None
    return "must be 1-64 characters of letters, digits, _ . : -"


def _read_engine(r: _Table) -> Engine | None:
    name = r.str_field("engine", "openai")
    engine = ENGINES.get(name)
    if engine is None:
        r.fail("engine", f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return engine


def _read_probe_timeout(r: _Table, interval: float) -> float | None:
    timeout = r.duration("probe_timeout", min(2.0, interval * 0.8))
    r.check(
        "probe_timeout",
        timeout,
        lambda v: (
            None if 0 < v < interval else f"must be above 0 and below the interval ({interval:g}s)"
        ),
    )
    return timeout


@dataclass(frozen=True, slots=True)
class _Finders:
    """How a target's process and logs are found (one of unit, pidfile, cmdline, container_id)."""

    unit: str | None
    pidfile: str | None
    cmdline: str | None
    container_id: str | None
    log_file: str | None
    journal: bool


def _read_finders(r: _Table) -> _Finders:
    keys = ("unit", "pidfile", "cmdline", "container_id")
    unit, pidfile, cmdline, container_id = (r.optional_str(k) for k in keys)
    r.check("unit", unit, _check_unit)
    r.check("cmdline", cmdline, _check_cmdline)
    r.check("pidfile", pidfile, _check_file_path)
    r.check("container_id", container_id, _check_container_id)
    given = [k for k, v in zip(keys, (unit, pidfile, cmdline, container_id), strict=True) if v]
    if len(given) > 1:
        r.fail(given[1], f"conflicts with {given[0]}: use one of {', '.join(keys)}")
    log_file = r.optional_str("log_file")
    r.check("log_file", log_file, _check_file_path)
    r.check("log_file", log_file, _check_log_file)
    journal = r.bool_field("journal", bool(unit) and not log_file)
    if journal and not unit:
        r.fail("journal", "needs unit to know which journal entries are this server's")
    return _Finders(unit, pidfile, cmdline, container_id, log_file, journal)


def _read_gpus(r: _Table) -> tuple[int | str, ...] | None:
    gpus = r.list_field("gpus")
    if gpus is None:
        return None
    kept = tuple(g for g in gpus if isinstance(g, int | str) and _gpu_selector(g))
    if len(kept) != len(gpus):
        bad = next(g for g in gpus if not _gpu_selector(g))
        r.fail(
            "gpus",
            f"{bad!r:.80} is not a GPU index (integer >= 0), GPU UUID (GPU-...) or MIG device "
            "UUID (MIG-..., as nvidia-smi -L prints it)",
        )
        return None
    return kept


def _gpu_selector(value: object) -> bool:
    """An index, or a GPU/MIG UUID as nvidia-smi -L prints it."""
    if isinstance(value, str):
        return _GPU_UUID.fullmatch(value) is not None
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_api_key(r: _Table) -> tuple[str | None, str | None]:
    api_key_file = r.optional_str("api_key_file")
    r.check("api_key_file", api_key_file, _check_file_path)
    api_key_env = r.optional_str("api_key_env")
    r.check("api_key_env", api_key_env, _check_env_name)
    if api_key_file and api_key_env:
        r.fail("api_key_env", "conflicts with api_key_file: use one")
    return api_key_file, api_key_env


def _read_target(
    path: str, errors: list[ConfigError], index: int, table: Mapping[str, object], interval: float
) -> Target | None:
    r = _Table(path, errors, f"target[{index}]", table)
    n_errors = len(errors)
    # Read in this order: problems are reported in the order the keys are read.
    name = _read_name(r)
    engine = _read_engine(r)
    base_url = r.required_str("base_url")
    r.check("base_url", base_url, _check_url)
    health_path = r.str_field("health_path", engine.health_path if engine else "/health")
    r.check("health_path", health_path, _check_path)
    if base_url and not (_check_url(base_url) or _check_path(health_path)):
        # the URL the probe requests, as the client will build it
        r.check("health_path", health_path, lambda p: _http_client_refusal(base_url, p))
    timeout = _read_probe_timeout(r, interval)
    completion_table = r.table_field("completion")
    finders = _read_finders(r)
    gpus = _read_gpus(r)
    api_key_file, api_key_env = _read_api_key(r)
    deployment = r.str_field("deployment", "")
    r.check("deployment", deployment, _check_text)  # a label value
    model = r.str_field("model", "")
    r.check("model", model, _check_text)  # a label value
    model_path = r.optional_str("model_path")
    r.check("model_path", model_path, _check_file_path)
    stall_table = r.table_field("stall")
    log_table = r.table_field("log")
    # The nested tables' keys last, after every key of the target itself.
    completion = (
        _read_completion(r.sub("completion", completion_table)) if completion_table else None
    )
    stall = _read_stall(r.sub("stall", stall_table))
    patterns = _read_patterns(r.sub("log", log_table))
    r.reject_unknown()
    if len(errors) > n_errors or engine is None or name is None or base_url is None:
        return None
    return Target(
        name=name,
        engine=engine.name,
        base_url=base_url,
        health_path=health_path,
        probe_timeout_seconds=timeout or 1.0,
        completion=completion,
        unit=finders.unit,
        pidfile=finders.pidfile,
        cmdline=finders.cmdline,
        container_id=finders.container_id,
        log_file=finders.log_file,
        journal=finders.journal,
        model_path=model_path,
        gpus=gpus,
        deployment=deployment,
        model=model,
        api_key_file=api_key_file,
        api_key_env=api_key_env,
        stall=stall,
        log_patterns=patterns,
    )


def _read_targets(
    path: str, errors: list[ConfigError], tables: list[object], interval: float
) -> tuple[Target, ...]:
    targets: list[Target] = []
    names: dict[str, int] = {}
    for i, table in enumerate(tables):
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
    return tuple(targets)


def _read_interval(ex: _Table) -> float:
    """The loop interval; 0 is refused like any other value out of range, not defaulted."""
    interval = ex.duration("interval", DEFAULT_INTERVAL_SECONDS)
    if interval is None or not 0.1 <= interval <= 300:
        ex.check("interval", interval, lambda _: "must be between 100ms and 5m")
        return DEFAULT_INTERVAL_SECONDS  # only so the targets' checks can go on
    return interval


def _check_name_template(
    value: str, placeholders: tuple[str, ...] = NAME_PLACEHOLDERS
) -> str | None:
    try:
        fields = [f for _text, f, _spec, _conv in string.Formatter().parse(value) if f is not None]
    except ValueError as exc:  # an unmatched brace
        return f"is not a template: {exc}"
    for name in fields:
        if name not in placeholders:
            known = ", ".join(f"{{{p}}}" for p in placeholders)
            return f"unknown placeholder {{{name}}}; known: {known}"
    return _check_word(value)


def _read_kubernetes(
    k: _Table, interval: float, environ: Mapping[str, str]
) -> KubernetesDiscovery | None:
    enabled = k.bool_field("enabled", True)
    node_name = k.optional_str("node_name") or environ.get("NODE_NAME", "")
    k.check("node_name", node_name, _check_word)
    kubeconfig = k.optional_str("kubeconfig")
    k.check("kubeconfig", kubeconfig, _check_file_path)
    template = k.str_field("name_template", "{namespace}/{pod}")
    k.check("name_template", template, _check_name_template)
    select = k.str_field("select", PodSelection.ANNOTATED)
    if select not in set(PodSelection):
        k.fail("select", f"must be one of {', '.join(PodSelection)}")
        select = PodSelection.ANNOTATED
    grace = k.duration("grace", 300.0)
    timeout = _read_probe_timeout(k, interval)
    k.reject_unknown()
    if enabled and not node_name:
        k.fail("node_name", "is required (or set the NODE_NAME environment variable)")
    if not enabled or not node_name:
        return None
    return KubernetesDiscovery(
        node_name=node_name,
        kubeconfig=kubeconfig,
        name_template=template,
        select=PodSelection(select),
        grace_seconds=300.0 if grace is None else grace,
        probe_timeout_seconds=timeout or 0.8,
    )


def _check_docker_template(value: str) -> str | None:
    return _check_name_template(value, DOCKER_NAME_PLACEHOLDERS)


def _read_docker(d: _Table, interval: float) -> DockerDiscovery | None:
    enabled = d.bool_field("enabled", True)
    socket = d.str_field("socket", DEFAULT_DOCKER_SOCKET)
    d.check("socket", socket, _check_file_path)
    template = d.str_field("name_template", "{container}")
    d.check("name_template", template, _check_docker_template)
    grace = d.duration("grace", 300.0)
    timeout = _read_probe_timeout(d, interval)
    d.reject_unknown()
    if not enabled:
        return None
    return DockerDiscovery(
        socket=socket,
        name_template=template,
        grace_seconds=300.0 if grace is None else grace,
        probe_timeout_seconds=timeout or 0.8,
    )


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
    top = _Table(path, errors, "", data)
    exporter_table = top.table_field("exporter")
    target_tables = top.list_field("target") or []
    discovery_table = top.table_field("discovery")
    top.reject_unknown()
    ex = top.sub("exporter", exporter_table)
    interval = _read_interval(ex)
    state_dir = ex.str_field("state_directory", DEFAULT_STATE_DIRECTORY)
    ex.check("state_directory", state_dir, _check_file_path)
    nvml = ex.bool_field("nvml", True)
    nvml_library_dir = ex.optional_str("nvml_library_dir")
    ex.check("nvml_library_dir", nvml_library_dir, _check_file_path)
    amdsmi = ex.bool_field("amdsmi", True)
    amdsmi_library_dir = ex.optional_str("amdsmi_library_dir")
    ex.check("amdsmi_library_dir", amdsmi_library_dir, _check_file_path)
    gpu_health_metrics = ex.str_field("gpu_health_metrics", "problems")
    if gpu_health_metrics not in GPU_HEALTH_METRICS:
        ex.fail("gpu_health_metrics", f"must be one of {', '.join(GPU_HEALTH_METRICS)}")
    ex.reject_unknown()
    targets = _read_targets(path, errors, target_tables, interval)
    discovery = top.sub("discovery", discovery_table)
    kubernetes_table = discovery.table_field("kubernetes")
    docker_table = discovery.table_field("docker")
    discovery.reject_unknown()
    kubernetes = (
        _read_kubernetes(
            discovery.sub("kubernetes", kubernetes_table),
            interval,
            os.environ if environ is None else environ,
        )
        if isinstance(discovery_table.get("kubernetes"), dict)
        else None
    )
    docker = (
        _read_docker(discovery.sub("docker", docker_table), interval)
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
