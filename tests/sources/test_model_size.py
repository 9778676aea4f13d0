"""The model-size source measures weights a slice at a time, and gives up on a huge tree."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from exporter.base.model import ModelSize
from exporter.sources import TargetSeen
from exporter.sources.model_size import ModelSizeSource


def _model(root: Path) -> int:
    """A small Hugging Face-like model directory; the bytes of its weights."""
    (root / "blobs").mkdir(parents=True)
    snap = root / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (root / "blobs" / "1").write_bytes(b"w" * 1000)
    (snap / "model-00001.safetensors").symlink_to(root / "blobs" / "1")
    (snap / "model-00002.safetensors").write_bytes(b"w" * 500)
    (snap / "config.json").write_bytes(b"{}" * 100)  # not weights
    elsewhere = root.parent / f"{root.name}-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "big.gguf").write_bytes(b"g" * 7000)
    (snap / "linked-dir").symlink_to(elsewhere)  # a linked directory is not followed
    return 1500


def test_a_model_directory_sums_its_weight_files(tmp_path):
    expected = _model(tmp_path / "model")
    source = ModelSizeSource("t", str(tmp_path / "model"))

    assert source.sample(None, TargetSeen()) == ModelSize(expected)
    assert source.sample(None, TargetSeen()) == ModelSize(expected)  # no re-walk: the total


def test_a_file_is_its_own_size_and_an_absent_path_is_unknown(tmp_path):
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"x" * 123)

    assert ModelSizeSource("t", str(weights)).sample() == ModelSize(123)
    assert ModelSizeSource("t", str(tmp_path / "none")).sample() == ModelSize(None)


def test_a_walk_goes_on_over_ticks_when_a_slice_ends(tmp_path):
    for i in range(3):
        (tmp_path / f"d{i}").mkdir()
        for j in range(400):
            (tmp_path / f"d{i}" / f"w{j}.bin").write_bytes(b"1")
    source = ModelSizeSource("t", str(tmp_path), slice_seconds=0.0)

    samples = [source.sample(None, TargetSeen()) for _ in range(10)]

    assert samples[0] == ModelSize(None)  # one slice looked at a few hundred entries only
    assert samples[-1] == ModelSize(1200)


def test_a_finished_start_measures_the_model_again(tmp_path):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x" * 10)
    source = ModelSizeSource("t", str(tmp_path))
    assert source.sample(None, TargetSeen()) == ModelSize(10)
    weights.write_bytes(b"x" * 20)  # a new model version, pulled while the server ran

    assert source.sample(None, TargetSeen(at_rest=True)) == ModelSize(10)
    assert source.sample(None, TargetSeen(starts_finished=1)) == ModelSize(20)


def test_a_tree_too_large_for_a_model_is_unknown_and_said_once(tmp_path, caplog):
    for j in range(50):
        os.link(_one(tmp_path), tmp_path / f"w{j}.bin")
    source = ModelSizeSource("t", str(tmp_path), max_files=20)

    with caplog.at_level(logging.WARNING, logger="exporter.sources.model_size"):
        assert source.sample(None, TargetSeen()) == ModelSize(None)
        assert source.sample(None, TargetSeen()) == ModelSize(None)
    (record,) = caplog.records
    assert "more than 20 files" in record.getMessage() and "target=t" in record.getMessage()
    assert str(tmp_path) not in record.getMessage()


def _one(directory: Path) -> Path:
    path = directory / "one.bin"
    if not path.exists():
        path.write_bytes(b"1")
    return path
