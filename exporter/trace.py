"""Observations and thresholds <-> JSON lines, for ``record`` and ``replay``. No I/O.

A trace is one JSON object per line: ``{"kind": "tick", "now": ..., "thresholds": {...},
"observation": {...}}`` per target per tick. Log lines in a trace are already redacted.

The codec is derived from the dataclasses' type hints rather than written field by field,
so whatever a source adds to ``Observation`` is recorded and replayed without a change
here: a field cannot be silently left out of a trace.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from exporter.base.model import Observation
from exporter.core.lifecycle import Thresholds

TRACE_VERSION = 1
T = TypeVar("T")
#: What ``json.dumps`` takes and ``json.loads`` returns.
Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]


def to_json(value: object) -> Json:
    """A dataclass (recursively: enums, tuples, mappings, scalars) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, Mapping):
        return {str(to_json(k)): to_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list | frozenset):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot encode {type(value).__name__}")


def from_json(kind: type[T], doc: object) -> T:
    """The inverse of ``to_json`` for the dataclass ``kind``.

    Raises:
        ValueError: a field is missing, unknown or has the wrong shape.
    """
    try:
        value: T = _decode(kind, doc)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed {kind.__name__}: {exc}") from exc
    return value


def observation_to_json(obs: Observation) -> Json:
    """An observation as JSON-ready data."""
    return to_json(obs)


def observation_from_json(doc: object) -> Observation:
    """The inverse of ``observation_to_json``.

    Raises:
        ValueError: a field is missing or has the wrong shape.
    """
    return from_json(Observation, doc)


def thresholds_to_json(th: Thresholds) -> Json:
    """Thresholds as JSON-ready data (phase-keyed maps become string-keyed)."""
    return to_json(th)


def thresholds_from_json(doc: object) -> Thresholds:
    """The inverse of ``thresholds_to_json``."""
    return from_json(Thresholds, doc)


@cache
def _hints(kind: type) -> dict[str, Any]:
    return get_type_hints(kind)


def _decode(hint: Any, doc: object) -> Any:  # a type hint is arbitrary typing data
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return _decode_union(get_args(hint), doc)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode_dataclass(hint, doc)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(doc)
    if origin is tuple:
        return _decode_tuple(get_args(hint), doc)
    if origin in (dict, Mapping):
        key, value = get_args(hint)
        return {_decode(key, k): _decode(value, v) for k, v in _mapping(doc).items()}
    return _decode_scalar(hint, doc)


def _decode_union(options: tuple[Any, ...], doc: object) -> Any:
    if doc is None and type(None) in options:
        return None
    (only,) = [o for o in options if o is not type(None)]
    return _decode(only, doc)


def _decode_dataclass(kind: type, doc: object) -> Any:
    fields = _mapping(doc)
    hints = _hints(kind)
    unknown = set(fields) - set(hints)
    if unknown:
        raise TypeError(f"unknown field {sorted(unknown)[0]!r}")
    return kind(**{name: _decode(hints[name], value) for name, value in fields.items()})


def _decode_tuple(args: tuple[Any, ...], doc: object) -> tuple[Any, ...]:
    if not isinstance(doc, list | tuple):
        raise TypeError(f"expected a list, got {type(doc).__name__}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(args[0], v) for v in doc)
    return tuple(_decode(a, v) for a, v in zip(args, doc, strict=True))


def _mapping(doc: object) -> Mapping[str, object]:
    if not isinstance(doc, Mapping):
        raise TypeError(f"expected an object, got {type(doc).__name__}")
    return doc


def _decode_scalar(hint: Any, doc: object) -> object:
    if hint is float and isinstance(doc, int | float) and not isinstance(doc, bool):
        return float(doc)
    if hint in (int, str, bool) and type(doc) is hint:
        return doc
    raise TypeError(f"expected {getattr(hint, '__name__', hint)}, got {type(doc).__name__}")
