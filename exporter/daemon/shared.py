"""Targets that read the same thing share one source: built once, sampled once a tick.

Eight targets on one engine (one pidfile, one health URL, one log file) used to walk the
same process tree, probe the same URL and read the same file eight times a tick. A source
that can be shared says what its readings depend on in ``share_key`` (every input its
constructor takes but the target's name); sources with equal keys are one instance, held
by each of those targets and closed with the last. Each tick the loop samples each
instance once, given its holders' ``TargetSeen`` merged, and every holder gets the same
reading under its own name. A target whose config changes so that its key does (another
pidfile, a restarted container's new ID) gets a source of its own and stops sharing.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from exporter.sources import Source, SourceCall, SourceResult, TargetSeen, TargetSource

if TYPE_CHECKING:
    from exporter.daemon.watched import Watched


@runtime_checkable
class Shareable(Protocol):
    """A source whose readings follow from ``share_key`` alone, not from its target."""

    @property
    def share_key(self) -> Hashable:
        """Equal for two sources exactly when they read the same thing the same way."""
        ...


@dataclass
class _Held:
    source: TargetSource[object]
    holders: int


class SharedSources:
    """The live shareable sources by key, and how many targets hold each."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, _Held] = {}
        self._keys: dict[int, Hashable] = {}

    def adopt(self, made: Sequence[TargetSource[object]]) -> tuple[TargetSource[object], ...]:
        """``made``, each shareable one replaced by the live one of its key (then closed).

        A replaced source was only built, never sampled: closing it releases nothing
        a holder uses.
        """
        adopted = []
        for source in made:
            key = source.share_key if isinstance(source, Shareable) else None
            held = self._by_key.get(key) if key is not None else None
            if held is not None:
                held.holders += 1
                source.close()
                source = held.source
            elif key is not None:
                self._by_key[key] = _Held(source, 1)
                self._keys[id(source)] = key
            adopted.append(source)
        return tuple(adopted)

    def release(self, source: Source[object]) -> bool:
        """One holder lets go; True when none is left (or it was never shared): close it."""
        key = self._keys.get(id(source))
        if key is None:
            return True
        held = self._by_key[key]
        held.holders -= 1
        if held.holders:
            return False
        del self._by_key[key], self._keys[id(source)]
        return True


@dataclass(frozen=True, slots=True)
class Holder:
    """One target's side of a round: its name, the sources it samples now, what it last saw."""

    name: str
    sources: Sequence[TargetSource[object]]
    seen: TargetSeen

    @classmethod
    def of(cls, watched: Watched, sources: Sequence[TargetSource[object]]) -> Holder:
        """``watched``'s side, sampling ``sources`` (some of its own) this round."""
        return cls(watched.target.name, sources, watched.seen)


@dataclass(frozen=True, slots=True)
class SharedRound:
    """A round's calls, one per distinct source, and where each holder's results are."""

    calls: list[SourceCall]
    #: For each holder, the index in ``calls`` of each of its sources, in its order.
    where: list[list[int]]
    names: list[str]

    @classmethod
    def of(cls, holders: Sequence[Holder]) -> SharedRound:
        """One call per distinct source; a shared one gets its holders' ``seen`` merged."""
        seen: dict[int, TargetSeen] = {}
        for h in holders:
            for s in h.sources:
                seen[id(s)] = merge_seen(seen[id(s)], h.seen) if id(s) in seen else h.seen
        index: dict[int, int] = {}
        calls: list[SourceCall] = []
        where = []
        for h in holders:
            mine = []
            for s in h.sources:
                if id(s) not in index:
                    index[id(s)] = len(calls)
                    sample = functools.partial(s.sample, seen=seen[id(s)])
                    calls.append(SourceCall(s, h.name, sample))
                mine.append(index[id(s)])
            where.append(mine)
        return cls(calls, where, [h.name for h in holders])

    def spread(self, results: Sequence[SourceResult[object]]) -> list[list[SourceResult[object]]]:
        """Each holder's results (``results`` in the order of ``calls``), under its name."""
        return [
            [_named(results[i], name) for i in mine]
            for mine, name in zip(self.where, self.names, strict=True)
        ]


def merge_seen(a: TargetSeen, b: TargetSeen) -> TargetSeen:
    """What a shared source is told of its holders ``a`` and ``b``.

    At rest only when both are (a start in either reads the tree in full), and a count of
    finished starts that moves whenever one holder's does.
    """
    return TargetSeen(a.at_rest and b.at_rest, a.starts_finished + b.starts_finished)


def _named(result: SourceResult[object], target: str) -> SourceResult[object]:
    if result.status.target == target:
        return result
    return SourceResult(result.value, replace(result.status, target=target))
