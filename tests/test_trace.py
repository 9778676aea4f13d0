"""The trace codec is derived from the types: every field of an observation is recorded."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing

import pytest

from exporter.base.model import Observation, Phase
from exporter.core.lifecycle import Thresholds
from exporter.trace import from_json, observation_from_json, observation_to_json, to_json


def example(hint, depth: int = 0):
    """A value of ``hint`` that differs from every default: so a dropped field shows."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        (only,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return example(only, depth)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: example(hints[f.name], depth + 1) for f in dataclasses.fields(hint)})
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)[-1]
    if origin is tuple:
        args = typing.get_args(hint)
        if args[1:] == (Ellipsis,):
            return (example(args[0], depth + 1), example(args[0], depth + 1))
        return tuple(example(a, depth + 1) for a in args)
    if origin in (dict, typing.Mapping, __import__("collections.abc").abc.Mapping):
        key, value = typing.get_args(hint)
        return {example(key, depth + 1): example(value, depth + 1)}
    return {int: 7, float: 2.5, str: "x", bool: True}[hint]


def test_every_observation_field_survives_a_trace():
    obs = example(Observation)
    unset = [
        f.name
        for f in dataclasses.fields(Observation)
        if getattr(obs, f.name) in (None, (), f.default)
    ]
    assert not unset, f"the example leaves {unset} at their defaults"
    assert observation_from_json(json.loads(json.dumps(observation_to_json(obs)))) == obs


def test_thresholds_keep_their_phase_keyed_maps():
    th = Thresholds(stall_seconds={Phase.LOADING: 90.0}, expected_phase_seconds={Phase.STARTING: 3})
    doc = json.loads(json.dumps(to_json(th)))
    assert doc["stall_seconds"] == {"loading": 90.0}
    assert from_json(Thresholds, doc) == Thresholds(
        stall_seconds={Phase.LOADING: 90.0}, expected_phase_seconds={Phase.STARTING: 3.0}
    )


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"target": "t"}, "at"),
        ({"target": "t", "at": 1.0, "surprise": 1}, "unknown field 'surprise'"),
        ({"target": "t", "at": "soon"}, "expected float, got str"),
        ({"target": "t", "at": 1.0, "process": {"pid": 1}}, "create_time"),
    ],
)
def test_a_malformed_observation_is_refused_with_what_is_wrong(doc, message):
    with pytest.raises(ValueError, match=message):
        observation_from_json(doc)
