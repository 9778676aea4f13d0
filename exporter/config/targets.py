"""``[[target]]`` tables -> ``Target``s: finders, probes, GPUs, API keys, stall and log tables."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from exporter.base.errors import ConfigError
from exporter.config.fields import (
    Table,
    above_zero,
    check_file_path,
    check_path,
    check_text,
    check_url,
    check_word,
    http_client_refusal,
    read_probe_timeout,
)
from exporter.config.regex import UserRegex, check_regex
from exporter.config.schema import CompletionProbe, StallThresholds, Target
from exporter.engines import ENGINES, Engine
from exporter.engines.profile import LogPatterns, Matcher

_LABEL_SAFE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
_UUID: Final = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
#: A GPU UUID, a MIG device UUID (R470+), or the MIG-GPU-<uuid>/<gi>/<ci> form of R450 drivers.
_GPU_UUID = re.compile(rf"GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/\d{{1,2}}/\d{{1,2}}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_log_file(value: str) -> str | None:
    """When it exists, a regular file (a FIFO or a device never ends)."""
    if not value.startswith("/"):
        return None  # check_file_path says so
    try:
        mode = os.stat(value).st_mode
    except OSError:
        return None  # may appear later (the engine creates it): the source reports it then
    return None if stat.S_ISREG(mode) else "is not a regular file (a FIFO or a device?)"


def _check_unit(value: str) -> str | None:
    if reason := check_word(value):
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


def _check_cmdline(value: str) -> str | None:
    return check_regex(value, ignore_case=False)


def _read_completion(c: Table) -> CompletionProbe | None:
    model = c.required_str("model")
    c.check("model", model, check_text)
    # 0 is refused, not read as "the default": an interval of 0 would never be what was meant.
    interval, timeout = c.duration("interval", 30.0), c.duration("timeout", 10.0)
    c.check("interval", interval, above_zero)
    c.check("timeout", timeout, above_zero)
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


def _read_stall(s: Table) -> StallThresholds:
    th = StallThresholds(
        starting=s.duration("starting", None),
        loading=s.duration("loading", None),
        initializing=s.duration("initializing", None),
        downloading=s.duration("downloading", None),
    )
    s.reject_unknown()
    return th


def _read_patterns(p: Table) -> LogPatterns:
    def compiled(key: str) -> tuple[Matcher, ...]:
        return tuple(UserRegex(r, ignore_case=True) for r in p.str_list(key, check_regex))

    patterns = LogPatterns(
        benign=compiled("benign"), fatal=compiled("fatal"), markers=compiled("markers")
    )
    p.reject_unknown()
    return patterns


def _read_name(r: Table) -> str | None:
    name = r.required_str("name")
    r.check("name", name, _check_label)
    return name


def _check_label(value: str) -> str | None:
    if _LABEL_SAFE.fullmatch(value):
        return None
    return "must be 1-64 characters of letters, digits, _ . : -"


def _read_engine(r: Table) -> Engine | None:
    name = r.str_field("engine", "openai")
    engine = ENGINES.get(name)
    if engine is None:
        r.fail("engine", f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return engine


@dataclass(frozen=True, slots=True)
class _Finders:
    """How a target's process and logs are found (one of unit, pidfile, cmdline, container_id)."""

    unit: str | None
    pidfile: str | None
    cmdline: str | None
    container_id: str | None
    log_file: str | None
    journal: bool


def _read_finders(r: Table) -> _Finders:
    keys = ("unit", "pidfile", "cmdline", "container_id")
    unit, pidfile, cmdline, container_id = (r.optional_str(k) for k in keys)
    r.check("unit", unit, _check_unit)
    r.check("cmdline", cmdline, _check_cmdline)
    r.check("pidfile", pidfile, check_file_path)
    r.check("container_id", container_id, _check_container_id)
    given = [k for k, v in zip(keys, (unit, pidfile, cmdline, container_id), strict=True) if v]
    if len(given) > 1:
        r.fail(given[1], f"conflicts with {given[0]}: use one of {', '.join(keys)}")
    log_file = r.optional_str("log_file")
    r.check("log_file", log_file, check_file_path)
    r.check("log_file", log_file, _check_log_file)
    journal = r.bool_field("journal", bool(unit) and not log_file)
    if journal and not unit:
        r.fail("journal", "needs unit to know which journal entries are this server's")
    return _Finders(unit, pidfile, cmdline, container_id, log_file, journal)


def _read_gpus(r: Table) -> tuple[int | str, ...] | None:
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


def _read_api_key(r: Table) -> tuple[str | None, str | None]:
    api_key_file = r.optional_str("api_key_file")
    r.check("api_key_file", api_key_file, check_file_path)
    api_key_env = r.optional_str("api_key_env")
    r.check("api_key_env", api_key_env, _check_env_name)
    if api_key_file and api_key_env:
        r.fail("api_key_env", "conflicts with api_key_file: use one")
    return api_key_file, api_key_env


def _read_target(
    path: str, errors: list[ConfigError], index: int, table: Mapping[str, object], interval: float
) -> Target | None:
    r = Table(path, errors, f"target[{index}]", table)
    n_errors = len(errors)
    # Read in this order: problems are reported in the order the keys are read.
    name = _read_name(r)
    engine = _read_engine(r)
    base_url = r.required_str("base_url")
    r.check("base_url", base_url, check_url)
    health_path = r.str_field("health_path", engine.health_path if engine else "/health")
    r.check("health_path", health_path, check_path)
    if base_url and not (check_url(base_url) or check_path(health_path)):
        # the URL the probe requests, as the client will build it
        r.check("health_path", health_path, lambda p: http_client_refusal(base_url, p))
    timeout = read_probe_timeout(r, interval)
    completion_table = r.table_field("completion")
    finders = _read_finders(r)
    gpus = _read_gpus(r)
    api_key_file, api_key_env = _read_api_key(r)
    deployment = r.str_field("deployment", "")
    r.check("deployment", deployment, check_text)  # a label value
    model = r.str_field("model", "")
    r.check("model", model, check_text)  # a label value
    model_path = r.optional_str("model_path")
    r.check("model_path", model_path, check_file_path)
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


def read_targets(
    path: str, errors: list[ConfigError], tables: list[object], interval: float
) -> tuple[Target, ...]:
    """Every ``[[target]]`` table that reads cleanly; names must be unique."""
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
