"""The target set: static targets, then discovered ones, as a difference for the loop to apply.

Static targets come from the config; discovered ones from one client per ``[discovery.*]``
section (Kubernetes pods, Docker containers), read at the start of each tick. A discovered
target whose name a static target already has is shadowed (warned once); one whose pod or
container is gone stays for its discovery's ``grace`` seconds, so its end is exported before
it disappears. Every change comes out as a ``TargetChange``: the new list and which names
were added, changed or removed. A reload is two-phase (``prepare``, then ``commit`` or
``abort``), so a config whose targets cannot be built leaves everything as it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.base.model import SourceStatus
from exporter.config import Settings, Target

if TYPE_CHECKING:
    from exporter.discovery.watch import Discovery

log = logging.getLogger("exporter.daemon")


@dataclass(frozen=True, slots=True)
class TargetChange:
    """The targets to watch from now on, and how they differ from those watched so far."""

    targets: tuple[Target, ...]
    added: frozenset[str] = frozenset()
    changed: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()


def difference(before: Sequence[Target], after: Sequence[Target]) -> TargetChange:
    """How ``after`` differs from ``before``, by target name."""
    old = {t.name: t for t in before}
    new = {t.name for t in after}
    return TargetChange(
        targets=tuple(after),
        added=frozenset(t.name for t in after if t.name not in old),
        changed=frozenset(t.name for t in after if t.name in old and old[t.name] != t),
        removed=frozenset(old.keys() - new),
    )


@dataclass(frozen=True, slots=True)
class PendingReload:
    """A reload started by ``TargetSet.prepare``: its change, and what commit will keep."""

    settings: Settings
    change: TargetChange
    discoveries: dict[str, Discovery]


class TargetSet:
    """Which targets the loop watches: the config's, then the discovered ones."""

    def __init__(self, settings: Settings, *, mono: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._mono = mono
        self.current: tuple[Target, ...] = tuple(settings.targets)
        #: Discovered targets by name, with when (monotonic) their pod or container was last
        #: seen and which discovery (``kubernetes``, ``docker``) found it.
        self._discovered: dict[str, tuple[Target, float, str]] = {}
        self._shadowed: set[str] = set()
        self._error: str | None = None
        self._discoveries = _start_discoveries(settings, settings, {})

    def follow(self) -> TargetChange | None:
        """Merge what the discoveries see now; the change to apply, None when there is none."""
        if not self._discoveries:
            return None
        now = self._mono()
        for kind, discovery in self._discoveries.items():
            for found in discovery.snapshot():
                self._discovered[found.target.name] = (found.target, now, kind)
        for name, (_target, seen, kind) in list(self._discovered.items()):
            if now - seen > _grace_seconds(self.settings, kind):
                del self._discovered[name]
                log.info("discovered target dropped target=%s after_s=%.0f", name, now - seen)
        targets = self._discovered_targets(self.settings, self._discoveries)
        change = difference(self.current, [*self.settings.targets, *targets])
        return change if change.targets != self.current else None

    def applied(self, change: TargetChange) -> None:
        """The loop watches ``change.targets`` now (after ``follow``)."""
        self.current = change.targets
        self._error = None
        for name in sorted(change.added):
            log.info("discovered target added target=%s", name)

    def rejected(self, exc: Exception) -> None:
        """The loop could not apply ``follow``'s change; it is retried next tick."""
        if str(exc) != self._error:  # once per problem, not once per tick
            log.error("discovered targets not applied first=%r", str(exc))
        self._error = str(exc)

    def prepare(self, settings: Settings) -> PendingReload:
        """Start the discoveries ``settings`` asks for; the change its targets make.

        Raises:
            ConfigError: credentials cannot be loaded; nothing was changed.
        """
        discoveries = _start_discoveries(settings, self.settings, self._discoveries)
        found = self._discovered_targets(settings, discoveries)
        change = difference(self.current, [*settings.targets, *found])
        return PendingReload(settings, change, discoveries)

    def abort(self, pending: PendingReload) -> None:
        """The loop could not apply the reload: close what ``prepare`` started."""
        for kind, discovery in pending.discoveries.items():
            if discovery is not self._discoveries.get(kind):
                discovery.close()

    def commit(self, pending: PendingReload) -> None:
        """The loop applied the reload: keep it, and close the discoveries it replaced."""
        for kind, old in self._discoveries.items():
            # The old watcher's targets stay for their grace, as for any gone pod; a
            # discovery turned off takes its targets along at once.
            if pending.discoveries.get(kind) is not old:
                old.close()
        kept = pending.discoveries
        self._discovered = {n: f for n, f in self._discovered.items() if f[2] in kept}
        self._discoveries = pending.discoveries
        self.settings = pending.settings
        self.current = pending.change.targets

    def statuses(self) -> list[SourceStatus]:
        """Each discovery as a source (``kubernetes``, ``docker``)."""
        found = []
        for kind, discovery in self._discoveries.items():
            health = discovery.health()
            found.append(SourceStatus(kind, health.up, 0.0, health.error))
        return found

    def dropped(self) -> tuple[tuple[str, int], ...]:
        """Per discovery, the targets it found but left out (over its cap, a name taken)."""
        return tuple((kind, d.health().dropped) for kind, d in self._discoveries.items())

    def close(self) -> None:
        """Stop every discovery client."""
        for discovery in self._discoveries.values():
            discovery.close()

    def _discovered_targets(
        self, settings: Settings, discoveries: Mapping[str, Discovery]
    ) -> list[Target]:
        """Targets of the running ``discoveries``, less those a static target's name takes."""
        static = {t.name for t in settings.targets}
        found = {n: f for n, f in self._discovered.items() if f[2] in discoveries}
        shadowed = {name for name in found if name in static}
        for name in sorted(shadowed - self._shadowed):
            log.warning("discovered target shadowed by a static one target=%s", name)
        self._shadowed = shadowed
        return [t for name, (t, _seen, _kind) in sorted(found.items()) if name not in static]


def _discovery_settings(settings: Settings) -> dict[str, object]:
    """Each discovery's section by kind (the kind is also its source's name)."""
    return {"kubernetes": settings.kubernetes, "docker": settings.docker}


def _grace_seconds(settings: Settings, kind: str) -> float:
    """How long a gone pod's or container's targets keep their final state."""
    section = settings.kubernetes if kind == "kubernetes" else settings.docker
    return section.grace_seconds if section is not None else 0.0


def _start_discoveries(
    settings: Settings, running: Settings, started: Mapping[str, Discovery]
) -> dict[str, Discovery]:
    """The discovery clients ``settings`` asks for, started or kept.

    Those of ``started`` whose section is as in ``running`` go on; the others start now.

    Raises:
        ConfigError: the Kubernetes credentials cannot be loaded (``check-config`` says so
            first); the clients started here are closed again.
    """
    wanted, before = _discovery_settings(settings), _discovery_settings(running)
    discoveries: dict[str, Discovery] = {}
    try:
        for kind, section in wanted.items():
            if section is None:
                continue
            old = started.get(kind)
            keep = old is not None and section == before[kind]
            discoveries[kind] = (
                old if old is not None and keep else _start_discovery(settings, kind)
            )
    except Exception:
        for kind, discovery in discoveries.items():
            if discovery is not started.get(kind):
                discovery.close()
        raise
    return discoveries


def _start_discovery(settings: Settings, kind: str) -> Discovery:
    """The started client of the ``[discovery.<kind>]`` section, which ``settings`` has."""
    # Imported here: a host without discovery never loads the watchers (nor PyYAML).
    from exporter.discovery.docker import ContainerWatcher
    from exporter.discovery.kubernetes import PodWatcher, load_credentials

    watcher: PodWatcher | ContainerWatcher
    if kind == "kubernetes" and settings.kubernetes is not None:
        credentials = load_credentials(settings.kubernetes, settings.source_path)
        watcher = PodWatcher(settings.kubernetes, credentials)
        log.info("kubernetes discovery started node=%s", settings.kubernetes.node_name)
    elif kind == "docker" and settings.docker is not None:
        watcher = ContainerWatcher(settings.docker)
        log.info("docker discovery started")
    else:
        raise ValueError(f"no [discovery.{kind}] section")
    watcher.start()
    return watcher
