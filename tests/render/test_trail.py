"""The /trail document: compact, bounded, and what the page draws from."""

from __future__ import annotations

import json
from dataclasses import replace

from exporter.core.trail import Trails
from exporter.render.trail import trail_json
from tests.core.test_trail import tick
from tests.render.test_metrics import snapshot


def test_before_the_first_tick_there_are_no_targets():
    assert json.loads(trail_json(None)) == {"taken_at": None, "targets": []}


def test_each_target_has_its_starts_points_marks_bands_and_threshold():
    trails = Trails()
    for i in range(4):
        trails = tick(trails, i)
    snap = snapshot()
    target = replace(snap.targets[0], trails=trails, stall_threshold_seconds=300.0)
    doc = json.loads(trail_json(replace(snap, targets=(target,))))
    (t,) = doc["targets"]
    assert t["target"] == "kimi" and t["stall_threshold_seconds"] == 300.0
    assert t["previous"] is None and t["current"]["gpus"] == [0, 1]
    assert len(t["current"]["points"]) == 4 and len(t["current"]["points"][0]) == 7
    assert t["current"]["bands"] == [[0.0, "loading"]]


def test_sixty_four_targets_with_two_long_starts_stay_small():
    trails = Trails()
    for i in range(1200):
        trails = tick(trails, i)
    trails = tick(trails, 0, pid=20)
    for i in range(1, 1200):
        trails = tick(trails, i, pid=20)
    snap = snapshot()
    targets = tuple(replace(snap.targets[0], trails=trails) for _ in range(64))
    body = trail_json(replace(snap, targets=targets))
    assert len(body) < 6 * 2**20, len(body)  # ~600 points per start, two GPUs each
