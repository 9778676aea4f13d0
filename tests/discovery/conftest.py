"""Fixtures of the discovery tests: a fake Docker daemon on a unix socket."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.discovery.fakedocker import FakeDocker


@pytest.fixture
def socket_path() -> Iterator[str]:
    """A socket path in a fresh directory of its own, removed afterwards."""
    # A unix socket path holds 108 bytes; pytest's tmp_path for a long test name may not.
    directory = tempfile.mkdtemp(prefix="dock", dir="/tmp")
    yield str(Path(directory, "docker.sock"))
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def docker(socket_path: str) -> Iterator[FakeDocker]:
    """A fake Docker daemon listening on ``socket_path``."""
    fake = FakeDocker(socket_path)
    yield fake
    fake.close()
