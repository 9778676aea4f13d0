"""A target's state: evolved as cheaply as a tick needs, the same state ``replace`` builds."""

from __future__ import annotations

import dataclasses

import pytest

from exporter.base.model import Phase
from exporter.core.lifecycle import initial_state
from exporter.core.lifecycle.state import TargetState, evolve


def test_an_evolved_state_is_the_state_replace_would_build() -> None:
    before = evolve(initial_state("vllm"), phase=Phase.LOADING, pid=41, phase_since=10.0)
    after = evolve(before, phase=Phase.READY, reason="health probe answers", ready_at=20.0)
    built = dataclasses.replace(
        initial_state("vllm"),
        phase=Phase.READY,
        pid=41,
        phase_since=10.0,
        reason="health probe answers",
        ready_at=20.0,
    )
    assert after == built and hash(after) == hash(built) and repr(after) == repr(built)
    assert before.phase is Phase.LOADING and before.ready_at is None  # the old one is as it was
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.phase = Phase.DOWN  # type: ignore[misc]


def test_a_change_to_the_values_it_holds_is_the_same_state() -> None:
    state = evolve(initial_state("vllm"), pid=41)
    assert evolve(state, pid=41, phase=state.phase) is state


def test_an_unknown_field_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="'pide'"):
        evolve(initial_state("vllm"), pide=41)


def test_every_field_is_set_by_init_and_nothing_runs_after_it() -> None:
    # ``evolve`` copies the fields without ``__init__``: a field outside it, or a
    # ``__post_init__``, would make its copy differ from the state ``replace`` builds.
    assert all(f.init for f in dataclasses.fields(TargetState))
    assert not hasattr(TargetState, "__post_init__")
