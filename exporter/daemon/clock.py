"""The daemon's clock and its tick-overrun log.

``AnchoredClock`` gives epoch seconds that advance with the monotonic clock and re-anchor
when the wall clock steps; ``OverrunLog`` counts ticks that took longer than the interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger("exporter.daemon")

#: Wall minus monotonic moving by more than this between two reads is a clock step, not jitter.
CLOCK_STEP_SECONDS: Final = 1.0
#: Tick overruns are logged at most this often (with the count since the last line).
OVERRUN_LOG_SECONDS: Final = 60.0


class AnchoredClock:
    """Epoch seconds that advance with the monotonic clock, re-anchored when the wall clock steps.

    Between steps the time is ``anchor + monotonic``, so NTP slewing or a read that races a
    step never stretches or reverses the loop's timers. When wall minus monotonic moves by
    more than ``step_seconds`` (an NTP step after boot, a manual ``date -s``), the anchor moves
    to the new wall clock at once, so exported timestamps (``last_tick_timestamp_seconds``,
    ``/status``) are right again instead of off for the life of the process. The daemon then
    moves every kept timestamp by the same step (``stepped_seconds``), so no duration jumps.
    """

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        *,
        step_seconds: float = CLOCK_STEP_SECONDS,
    ) -> None:
        self._wall, self._mono, self._step_seconds = wall, mono, step_seconds
        self._offset = self._first_offset = wall() - mono()
        #: How many steps were seen, and the last one's size in seconds (+ forward).
        self.steps = 0
        self.last_step_seconds = 0.0

    def __call__(self) -> float:
        """Epoch seconds now (re-anchoring first when the wall clock stepped)."""
        mono = self._mono()
        offset = self._wall() - mono
        if abs(offset - self._offset) > self._step_seconds:
            self.steps += 1
            self.last_step_seconds = offset - self._offset
            self._offset = offset
            log.warning(
                "wall clock stepped, timestamps re-anchored step_s=%.3f steps=%d",
                self.last_step_seconds,
                self.steps,
            )
        return self._offset + mono

    @property
    def stepped_seconds(self) -> float:
        """How far the wall clock stepped in all since this clock was made (+ forward)."""
        return self._offset - self._first_offset


def anchored_clock(
    wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic
) -> AnchoredClock:
    """The daemon's clock: see ``AnchoredClock``."""
    return AnchoredClock(wall, mono)


class OverrunLog:
    """Counts ticks that took longer than the interval; one warning a minute at most."""

    def __init__(self, every: float = OVERRUN_LOG_SECONDS) -> None:
        self.total = 0
        self._every = every
        self._unlogged = 0
        self._logged_at: float | None = None

    def tick(self, took: float, interval: float, now_mono: float) -> None:
        """Note one tick of ``took`` seconds against ``interval``."""
        if took <= interval:
            return
        self.total += 1
        self._unlogged += 1
        if self._logged_at is not None and now_mono - self._logged_at < self._every:
            return
        log.warning(
            "tick overran the interval took_s=%.3f interval_s=%g overruns=%d total=%d "
            "(slow sources or too many targets: see inference_exporter_source_duration_seconds)",
            took,
            interval,
            self._unlogged,
            self.total,
        )
        self._logged_at, self._unlogged = now_mono, 0
