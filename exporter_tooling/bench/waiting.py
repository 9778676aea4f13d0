"""Polling until something holds, and the error a bench run stops with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")
_POLL: Final = 0.02


class BenchError(Exception):
    """A measurement could not be taken (a process did not start or answer)."""


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` until it returns something other than None.

    Raises:
        BenchError: ``timeout`` seconds passed first.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(_POLL)
    raise BenchError(f"timed out after {timeout:g}s waiting for {what}")


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds (``BenchError`` after ``timeout`` seconds)."""
    wait_for(lambda: True if condition() else None, timeout, what)
