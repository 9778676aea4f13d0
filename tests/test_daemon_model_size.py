"""A model path of ``/`` froze every tick for 18 s while ``/-/healthy`` said 200 (issue 30 #3).

The model's size is a per-target source now, walked a slice a tick under the tick's deadline
(and given up past a bound in files, see ``tests/sources/test_model_size.py``): a large tree
costs each tick a slice, the other targets are sampled every tick, and the daemon publishes
its first snapshot at once instead of after the walk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from exporter.config import Settings, Target
from exporter.daemon import Daemon
from exporter.history import History
from tests.httpservers import LoopbackServer, closed_port, reply

#: Directories of a thousand weight files: far more than a model has (a whole cache, ``/``).
DIRECTORIES = 40


@pytest.fixture(scope="module")
def huge_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DIRECTORIES x 1001 one-byte weight files (hard links: cheap to make)."""
    root = tmp_path_factory.mktemp("huge")
    for d in range(DIRECTORIES):
        sub = root / f"d{d}"
        sub.mkdir()
        one = sub / "one.safetensors"
        one.write_bytes(b"1")
        for f in range(1000):
            os.link(one, sub / f"w{f}.safetensors")
    return root


def _target(name: str, url: str, model_path: str | None = None) -> Target:
    return Target(
        name=name,
        engine="openai",
        base_url=url,
        health_path="/health",
        probe_timeout_seconds=0.3,
        model_path=model_path,
    )


@pytest.mark.integration
def test_a_large_model_path_never_freezes_the_loop(huge_tree, tmp_path):
    with LoopbackServer({"/health": reply(200)}) as other:
        settings = Settings(
            interval_seconds=1.0,
            state_directory=str(tmp_path),
            nvml=False,
            targets=(
                _target("big", f"http://127.0.0.1:{closed_port()}", str(huge_tree)),
                _target("other", other.url),
            ),
        )
        weights: list[tuple[str, int | None]] = []
        started = time.monotonic()
        daemon = Daemon(
            settings,
            history=History.open(None),
            on_step=lambda obs, _now, th: weights.append((obs.target, th.weights_bytes)),
        )
        total = DIRECTORIES * 1001
        try:
            snaps = [daemon.tick()]
            # Before, the daemon walked the whole tree before its first tick (and after
            # every finished start, inside a tick).
            assert time.monotonic() - started < settings.interval_seconds
            while ("big", total) not in weights and len(snaps) < 1000:
                snaps.append(daemon.tick())
        finally:
            daemon.close()
    assert ("big", total) in weights  # the same size as a walk in one go
    assert len(snaps) > 1  # measured over several ticks' slices, not in one stop
    assert all(s.tick_duration_seconds < settings.interval_seconds for s in snaps)
    assert len(other.requests) >= len(snaps)  # the other target was probed every tick
    for snap in snaps:
        up = {(s.source, s.target): s.up for s in snap.sources}
        assert up[("probe", "other")] and up[("model_size", "big")]


@pytest.mark.integration
def test_a_model_directory_sizes_the_start_from_the_first_tick(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w" * 4096)
    (model / "tokenizer.json").write_bytes(b"{}")
    settings = Settings(
        interval_seconds=1.0,
        state_directory=str(tmp_path),
        nvml=False,
        targets=(_target("m", f"http://127.0.0.1:{closed_port()}", str(model)),),
    )
    seen: list[int | None] = []
    daemon = Daemon(
        settings,
        history=History.open(None),
        on_step=lambda _obs, _now, th: seen.append(th.weights_bytes),
    )
    try:
        daemon.tick()
        daemon.tick()
    finally:
        daemon.close()
    assert seen == [4096, 4096]
