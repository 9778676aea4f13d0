"""The ``/status`` document's shape, shared by its producer and every reader.

``exporter.render.status`` builds a ``StatusDoc``; ``wait``, ``status`` (and the page's script)
read one. Readers get the document from the network, so ``parse_status_doc`` checks the shape
against these very declarations before anyone indexes into it: one declaration, no drift.
The producer always writes every key; a reader tolerates documents that lack some.

No ``from __future__ import annotations`` here: ``NotRequired`` must stay visible to
``TypedDict`` at class creation for ``__required_keys__`` to be right on Python 3.11.
"""

import functools
import types
import typing
from typing import NotRequired, TypedDict, Union, cast, get_args, get_origin, get_type_hints


class ShardDoc(TypedDict):
    """Progress of one counted thing (``shards``, ``draft:shards``)."""

    key: str
    done: int
    total: int


class ProcessDoc(TypedDict):
    """The server's process tree."""

    processes: int
    rss_bytes: int | None
    cpu_seconds: float | None
    read_bytes: int | None
    read_bytes_error: str | None


class ProbeDoc(TypedDict):
    """The last health or completion probe."""

    outcome: str
    status_code: int | None
    duration_seconds: float
    at: float
    loading: bool


class ProbesDoc(TypedDict):
    """The last probe of each kind."""

    health: ProbeDoc | None
    completion: ProbeDoc | None


TransitionDoc = TypedDict("TransitionDoc", {"at": float, "from": str, "to": str, "reason": str})
TransitionDoc.__doc__ = """One phase change (``from`` is a keyword, hence the functional form)."""

LineDoc = TypedDict("LineDoc", {"at": float, "class": str, "text": str})
LineDoc.__doc__ = """One notable log line, already redacted."""


class ModelDoc(TypedDict):
    """One model of a multi-model server, as the server reports it."""

    name: str
    version: str
    state: str
    reason: str | None


class EngineReportDoc(TypedDict):
    """What the engine reports about its own startup, beside what was observed."""

    load_seconds: float | None
    startup_seconds: float | None
    steps: dict[str, float]
    models: list[ModelDoc]
    #: The observed loading phase of the last finished start, to compare.
    observed_load_seconds: float | None
    #: A line when the engine's and the observed load time disagree widely.
    disagreement: str | None


class StartupProbeDoc(TypedDict):
    """Kubernetes startupProbe numbers that cover this target's starts (history's p95)."""

    period_seconds: int
    failure_threshold: int
    p95_cold_start_seconds: float


class WakeDoc(TypedDict):
    """The last wake from sleep mode (not a cold start)."""

    started_at: float
    ended_at: float
    duration_seconds: float
    wakes: int


class ColdStartDoc(TypedDict):
    """One finished cold start."""

    started_at: float
    ended_at: float
    duration_seconds: float
    outcome: str
    reason: str | None
    phase_seconds: dict[str, float]
    read_bytes: int | None
    peak_gpu_bytes: int | None


class TimelineRowDoc(TypedDict):
    """One startup phase of the current cold start, in order."""

    phase: str
    seconds: float
    running: bool


class PhaseBoundDoc(TypedDict):
    """What bounded one phase of a start, the figures behind it and the advice line."""

    phase: str
    #: disk, page_cache, network, cpu, gpu, peers or idle.
    bound: str
    running: bool
    seconds: float
    #: One line for people: the figures, the verdict and what it would take.
    advice: str
    read_bytes: int
    read_bytes_per_second: float
    device_read_bytes: int
    cpu_cores: float
    download_bytes: int
    gpu_utilization_ratio: float | None
    memory_grown_bytes: int
    resident_grown_bytes: int
    peer_lines: int
    best_read_bytes_per_second: float | None
    would_take_seconds: float | None


class GpuMemoryDoc(TypedDict):
    """A target's memory on one GPU, and that card's total."""

    gpu: int
    used_bytes: int
    total_bytes: int | None


class MigMemoryDoc(TypedDict):
    """A target's memory on one MIG device (slice), and that slice's size."""

    mig_uuid: str
    gpu: int | None
    gpu_instance_id: int | None
    profile: str | None
    used_bytes: int
    total_bytes: int | None


class MigDoc(TypedDict):
    """One MIG device of a MIG-enabled GPU."""

    mig_uuid: str
    gpu: int
    gpu_instance_id: int
    compute_instance_id: int
    profile: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


class TargetDoc(TypedDict):
    """One watched server."""

    target: str
    engine: str
    deployment: str
    model: str
    phase: str
    reason: str
    since: float | None
    phase_seconds: float | None
    started_at: float | None
    elapsed_seconds: float | None
    ready: bool
    stalled: bool
    stall_reason: str | None
    last_progress_at: float | None
    last_evidence: str | None
    progress_ratio: float | None
    shards: list[ShardDoc]
    eta_seconds: float | None
    failure_reason: str | None
    #: The decisive log line of a failure (redacted, ~200 characters), never a label.
    reason_detail: str | None
    process: ProcessDoc | None
    gpu_memory_bytes: dict[str, int]
    probes: ProbesDoc
    current_phases: dict[str, float]
    transitions: list[TransitionDoc]
    notable_lines: list[LineDoc]
    last_cold_start: ColdStartDoc | None
    last_wake: WakeDoc | None
    #: The fast weight loader the log names ("runai-streamer", "tensorizer", ...), if any.
    loader: str | None
    loader_bytes_per_second: float | None
    #: Bytes the tree wrote while downloading the model (0 when it never downloaded).
    download_bytes: int
    download_bytes_per_second: float | None
    #: GPU index -> bytes still held by the previous, dead instance's processes.
    orphaned_gpu_memory_bytes: dict[str, int]
    engine_report: EngineReportDoc | None
    #: Recommended startupProbe numbers, from history; None before a good start finished.
    startup_probe: StartupProbeDoc | None
    restarts: int
    seconds_since_progress: float | None
    timeline: list[TimelineRowDoc]
    previous_cold_start: ColdStartDoc | None
    typical_cold_start_seconds: float | None
    gpu_memory: list[GpuMemoryDoc]
    #: The MIG slices the target's processes run on (empty off MIG).
    mig_memory: list[MigMemoryDoc]
    #: The running start's phases with their bounds (empty between starts).
    bounds: list[PhaseBoundDoc]
    #: The last finished start's phases with their bounds.
    last_start_bounds: list[PhaseBoundDoc]


class GpuHealthDoc(TypedDict):
    """One GPU's health readings; None (or absent from a list) where the GPU cannot say."""

    xid_errors: dict[str, int]  # Xid events since the exporter started, by xid label
    ecc_uncorrected_volatile: int | None
    retired_pages_pending: bool | None
    remapped_rows_pending: bool | None
    remapped_rows_failed: bool | None
    throttle_reasons: list[str] | None  # the active ones of gpuhealth.THROTTLE_REASONS
    pcie_link: str | None  # e.g. "Gen4 x8 (max Gen5 x16)"
    unsupported: list[str]


class GpuDoc(TypedDict):
    """One GPU of the host."""

    gpu: int
    uuid: str
    name: str
    up: bool
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_ratio: float | None
    error: str | None
    #: MIG mode is on; None where the GPU cannot do MIG.
    mig_enabled: bool | None
    health: GpuHealthDoc


class SourceDoc(TypedDict):
    """Whether one source worked on the last tick.

    ``state``: ``up``, ``down`` (it failed), or ``absent`` (what it reads is not on this
    host, such as NVML without an NVIDIA library: ``up`` is false, but nothing is broken).
    """

    source: str
    target: str | None
    up: bool
    state: NotRequired[str]
    error: str | None


class StatusDoc(TypedDict):
    """The whole document; before the first tick only ``ready`` (false) and empty lists."""

    ready: bool
    targets: list[TargetDoc]
    sources: list[SourceDoc]
    gpus: list[GpuDoc]
    version: NotRequired[str]
    taken_at: NotRequired[float]
    #: When the tick that made the snapshot began sampling (``wait`` trusts later ones only).
    sampled_at: NotRequired[float]
    gpu_stale: NotRequired[bool]
    foreign_gpu_memory_bytes: NotRequired[dict[str, int]]
    migs: NotRequired[list[MigDoc]]


class MalformedStatus(ValueError):
    """A document that is not the exporter's ``/status``; the message names the field."""


#: Keys a reader cannot do without; any other missing key gets its type's empty value
#: (None, [], {}, false, "", 0), so an older exporter's or a hand-written document still reads.
_ESSENTIAL: typing.Final[typing.Mapping[str, frozenset[str]]] = {
    "StatusDoc": frozenset({"ready", "targets"}),
    "TargetDoc": frozenset({"target", "phase"}),
}


def parse_status_doc(raw: object) -> StatusDoc:
    """``raw`` (decoded JSON) as a ``StatusDoc``: checked field by field, gaps filled.

    Keys the declarations do not know are dropped (a newer exporter may add some); a missing
    key that is not essential gets its type's empty value. ``raw`` is not changed.

    Raises:
        MalformedStatus: a field has the wrong type, or an essential one is missing, e.g.
            ``targets[0].phase: must be a string, not null``.
    """
    return cast(StatusDoc, _convert(raw, StatusDoc, ""))


_NAMES: typing.Final[typing.Mapping[type, str]] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    list: "a list",
    dict: "an object",
}
_EMPTY: typing.Final[typing.Mapping[type, object]] = {str: "", int: 0, float: 0.0, bool: False}


def _convert(value: object, kind: object, where: str) -> object:
    origin = get_origin(kind)
    if origin is Union or origin is types.UnionType:
        return _convert_optional(value, get_args(kind), where)
    if typing.is_typeddict(kind):
        return _convert_object(value, cast(type, kind), where)
    if origin is list:
        (item,) = get_args(kind)
        return [_convert(e, item, f"{where}[{i}]") for i, e in enumerate(_as_list(value, where))]
    if origin is dict:
        _, item = get_args(kind)
        return {k: _convert(e, item, _join(where, k)) for k, e in _as_dict(value, where).items()}
    if not _is_scalar(value, cast(type, kind)):
        raise _wrong(value, cast(type, kind), where)
    return value


def _convert_optional(value: object, kinds: tuple[object, ...], where: str) -> object:
    # The declarations only use unions of the form ``X | None``.
    if value is None and type(None) in kinds:
        return None
    (kind,) = (k for k in kinds if k is not type(None))
    return _convert(value, kind, where)


def _convert_object(value: object, kind: type, where: str) -> dict[str, object]:
    obj = _as_dict(value, where)
    required: frozenset[str] = getattr(kind, "__required_keys__", frozenset())
    essential = _ESSENTIAL.get(kind.__name__, frozenset())
    out: dict[str, object] = {}
    for key, hint in _fields(kind).items():
        if key in obj:
            out[key] = _convert(obj[key], hint, _join(where, key))
        elif key in essential:
            raise MalformedStatus(f"{_join(where, key)}: missing")
        elif key in required:
            out[key] = _empty(hint, _join(where, key))
    return out


def _empty(kind: object, where: str) -> object:
    origin = get_origin(kind)
    if origin is Union or origin is types.UnionType:
        return None
    if origin is list:
        return []
    if origin is dict:
        return {}
    if typing.is_typeddict(kind):
        return _convert_object({}, cast(type, kind), where)
    return _EMPTY[cast(type, kind)]


@functools.cache
def _fields(kind: type) -> dict[str, object]:
    return get_type_hints(kind)


def _as_list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise _wrong(value, list, where)
    return value


def _as_dict(value: object, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _wrong(value, dict, where)
    return value


def _is_scalar(value: object, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float)  # JSON has one number type
    return isinstance(value, kind)


def _wrong(value: object, kind: type, where: str) -> MalformedStatus:
    expected = _NAMES.get(kind, kind.__name__)
    found = _NAMES.get(type(value), type(value).__name__)
    return MalformedStatus(f"{where or 'the document'}: must be {expected}, not {found}")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
