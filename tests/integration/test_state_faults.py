"""The history's state directory misbehaving under the real exporter process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import exporter

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def read_only_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory no write reaches: a read-only bind mount as root (mode bits bind no root),
    mode 0555 for anyone else."""
    source, where = tmp_path / "source", tmp_path / "state"
    source.mkdir()
    where.mkdir()
    if os.geteuid() != 0:
        where.chmod(0o555)
        yield where
        return
    mounted = subprocess.run(["mount", "--bind", str(source), str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no bind mount here: {mounted.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_read_only_state_directory_runs_with_history_in_memory(tmp_path):
    """Before: ``run`` exited 2 (``state_directory: is not writable``), as check-config does."""
    with read_only_directory(tmp_path) as state:
        with exporter(tmp_path, "", state=state) as exp:
            assert exp.proc.poll() is None
            assert 'inference_exporter_source_up{source="history",target=""} 0.0' in exp.metrics()
            assert "keeping history in memory" in exp.log_text()
        config = next(tmp_path.glob("config-*.toml"))
        checked = subprocess.run(
            [sys.executable, "-m", "exporter", "check-config", "--config.file", str(config)],
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 2 and "state_directory: is not writable" in checked.stderr
