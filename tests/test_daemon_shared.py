"""Targets on one engine share what they read: one tree, one health probe, one log reader.

Eight targets of one engine (one pidfile, one health URL, one log file) cost eight times
each read (issue 29's last missed row); now they cost one. Each target must still see all of
its evidence: every line of the file, the process and its end within a tick, its probes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from exporter.base.model import Phase
from exporter.config import Settings, Target
from exporter.core.snapshot import Snapshot
from exporter.daemon import Daemon
from exporter.daemon.shared import Holder, SharedRound, SharedSources
from exporter.history import History
from exporter.sources import TargetSeen, run_source
from exporter.sources.logs import FileLogSource
from tests.httpservers import LoopbackServer, reply

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Engine:
    """A running stand-in engine process and the pidfile naming it."""

    proc: subprocess.Popen[bytes]
    pidfile: Path


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """The engine the targets watch."""
    yield from _engine(tmp_path / "engine.pid")


@pytest.fixture
def other_engine(tmp_path: Path) -> Iterator[Engine]:
    """A second engine process, for a target that moves to it."""
    yield from _engine(tmp_path / "other.pid")


def _engine(pidfile: Path) -> Iterator[Engine]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pidfile.write_text(f"{proc.pid}\n")
    try:
        yield Engine(proc, pidfile)
    finally:
        proc.kill()
        proc.wait()


def _target(name: str, url: str, engine: Engine, log: Path) -> Target:
    return Target(
        name=name,
        engine="openai",
        base_url=url,
        health_path="/health",
        probe_timeout_seconds=0.4,
        pidfile=str(engine.pidfile),
        log_file=str(log),
    )


def _settings(tmp_path: Path, *targets: Target) -> Settings:
    return Settings(
        interval_seconds=0.5, state_directory=str(tmp_path), nvml=False, targets=targets
    )


def _lines(snap: Snapshot, name: str) -> int:
    (t,) = [t for t in snap.targets if t.info.name == name]
    return sum(n for _, n in t.state.counters.log_lines)


def _pid(snap: Snapshot, name: str) -> int | None:
    (t,) = [t for t in snap.targets if t.info.name == name]
    return t.process.pid if t.process else None


def _ready(daemon: Daemon) -> Snapshot:
    for _ in range(20):
        snap = daemon.tick()
        if all(t.state.phase is Phase.READY for t in snap.targets):
            return snap
    raise AssertionError("the targets did not become ready")


def _health_probes(server: LoopbackServer) -> int:
    return sum(r.path == "/health" for r in server.requests)


@contextmanager
def _two_targets(tmp_path: Path, engine: Engine) -> Iterator[tuple[Daemon, LoopbackServer]]:
    """Targets a and b on one engine, one health URL and one (empty) log, ready."""
    log = tmp_path / "engine.log"
    log.write_text("")
    with LoopbackServer({"/health": reply(200)}) as server:
        targets = [_target(n, server.url, engine, log) for n in ("a", "b")]
        daemon = Daemon(_settings(tmp_path, *targets), history=History.open(None))
        try:
            _ready(daemon)
            yield daemon, server
        finally:
            daemon.close()


def test_two_targets_of_one_engine_read_once_and_each_sees_every_line(tmp_path, engine):
    with _two_targets(tmp_path, engine) as (daemon, server):
        before = {n: _lines(daemon.tick(), n) for n in ("a", "b")}
        probes = _health_probes(server)
        with open(tmp_path / "engine.log", "a") as fh:
            fh.write('INFO:     127.0.0.1:4000 - "GET /health HTTP/1.1" 200 OK\n' * 5)
        snap = daemon.tick()
    assert {n: _lines(snap, n) - before[n] for n in ("a", "b")} == {"a": 5, "b": 5}
    assert _health_probes(server) == probes + 1  # one probe a tick for both
    assert _pid(snap, "a") == _pid(snap, "b") == engine.proc.pid
    # each target still has its own source series
    up = {(s.source, s.target) for s in snap.sources if s.up}
    assert {("process", "a"), ("process", "b"), ("logs", "a"), ("logs", "b")} <= up
    assert {("probe", "a"), ("probe", "b")} <= up


def test_a_shared_process_that_ends_is_seen_by_every_target_in_the_next_tick(tmp_path, engine):
    with _two_targets(tmp_path, engine) as (daemon, server):
        engine.proc.kill()
        engine.proc.wait()
        server.routes["/health"] = reply(503)
        snap = daemon.tick()
    assert [_pid(snap, n) for n in ("a", "b")] == [None, None]
    (phase,) = {t.state.phase for t in snap.targets}  # the same for both, at once
    assert phase is not Phase.READY


def test_a_target_moved_to_another_process_stops_sharing(tmp_path, engine, other_engine):
    log = tmp_path / "engine.log"
    log.write_text("")
    with LoopbackServer({"/health": reply(200)}) as server:
        a, b = (_target(n, server.url, engine, log) for n in ("a", "b"))
        daemon = Daemon(_settings(tmp_path, a, b), history=History.open(None))
        try:
            _ready(daemon)
            moved = _target("b", server.url, other_engine, log)
            assert daemon.reload(lambda: _settings(tmp_path, a, moved))
            snap = daemon.tick()
            assert _pid(snap, "a") == engine.proc.pid
            assert _pid(snap, "b") == other_engine.proc.pid
            # b leaves: a's tree and log go on (b's close closed nothing a holds)
            assert daemon.reload(lambda: _settings(tmp_path, a))
            before = _lines(daemon.tick(), "a")
            with open(log, "a") as fh:
                fh.write("INFO 05-12 02:45:30 [api_server.py:1] still here\n" * 3)
            snap = daemon.tick()
        finally:
            daemon.close()
    assert _pid(snap, "a") == engine.proc.pid
    assert _lines(snap, "a") - before == 3


def test_sources_of_one_file_are_one_instance_closed_with_its_last_holder(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("one\n")
    shared = SharedSources()
    (first,) = shared.adopt([FileLogSource(str(log), offset_file=str(tmp_path / "a.logpos"))])
    (second,) = shared.adopt([FileLogSource(str(log), offset_file=str(tmp_path / "b.logpos"))])
    (elsewhere,) = shared.adopt([FileLogSource(str(tmp_path / "other.log"))])
    assert second is first and elsewhere is not first
    assert first.sample().block is not None  # still open and reading
    assert shared.release(first) is False  # b still holds it
    assert shared.release(second) is True  # the last holder: the caller closes it
    second.close()
    assert shared.release(elsewhere) is True


class _Recording:
    """A source that remembers what it was told; stands in where only the plumbing matters."""

    name = "process"

    def __init__(self) -> None:
        self.seen: list[TargetSeen | None] = []

    def sample(self, deadline: float, seen: TargetSeen | None = None) -> int:
        self.seen.append(seen)
        return len(self.seen)

    def close(self) -> None:
        """Nothing to release."""


def test_a_shared_source_is_called_once_a_round_and_at_rest_only_when_every_holder_is():
    shared, own = _Recording(), _Recording()
    holders = [
        Holder("a", [shared], TargetSeen(at_rest=True, starts_finished=2)),
        Holder("b", [shared, own], TargetSeen(at_rest=False, starts_finished=1)),
    ]
    rnd = SharedRound.of(holders)
    results = [run_source(c.source.name, partial(c.sample, 0.0)) for c in rnd.calls]
    spread = rnd.spread(results)
    assert shared.seen == [TargetSeen(at_rest=False, starts_finished=3)]  # b is starting
    assert own.seen == [TargetSeen(at_rest=False, starts_finished=1)]
    assert [[r.value for r in mine] for mine in spread] == [[1], [1, 1]]
    assert [[r.status.target for r in mine] for mine in spread] == [["a"], ["b", "b"]]
