"""Shared pytest options and fixtures: ``--update-golden``, real cgroup directories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cgroupfs import rmdir_when_empty


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/fixtures/metrics/*.prom from the current output",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def cgroup_dir() -> Iterator[Callable[[Path], Path]]:
    """Create real cgroup directories (writable as root); removed, deepest first, afterwards."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            made.append(p)
        return path

    yield make
    for path in reversed(made):
        for child in sorted(path.rglob("*"), reverse=True):
            if child.is_dir():
                rmdir_when_empty(child)
        rmdir_when_empty(path)
