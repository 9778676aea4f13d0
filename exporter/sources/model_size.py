"""Model-size source: the bytes of a target's weight files, for read-based progress.

I/O only, and bounded: the directory is walked a slice at a time (``SLICE_SECONDS`` a tick at
most, never past the tick's deadline), so a path of ``/`` or a huge cache costs each tick a
slice instead of freezing the loop for a whole walk (issue 30: 18 s a tick, every target
unsampled). A walk that meets more than ``MAX_FILES`` entries is not a model directory: its
size is unknown. The path is walked once when the source is made (a changed path is a new
target, so a new source) and again after each finished start, when the model may have been
replaced; between walks every sample returns the last total at no cost.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Final

from exporter.base.model import ModelSize
from exporter.sources import TargetSeen

log = logging.getLogger(__name__)

#: Suffixes of the files counted as weights.
WEIGHT_SUFFIXES: Final = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".engine")
#: Entries (files and directories) one walk looks at before it gives up: a model has dozens.
MAX_FILES: Final = 100_000
#: Walking time a tick spends at most; the rest of a large walk waits for the next ticks.
SLICE_SECONDS: Final = 0.05
#: Entries looked at between two looks at the clock.
_CLOCK_EVERY: Final = 256


class _Walk:
    """One walk of a model path, resumable: the directory being listed and those still to list.

    The open listing survives between samples, so a single directory of a million entries is
    walked a slice at a time too; ``close`` releases it.
    """

    def __init__(self, path: str, max_files: int) -> None:
        self._pending = [path]
        self._listing: os._ScandirIterator[str] | None = None
        self._max_files = max_files
        self.seen = 0
        self.total = 0
        self.too_large = False

    @property
    def done(self) -> bool:
        """The walk has listed everything, or met too many entries."""
        return self.too_large or (self._listing is None and not self._pending)

    def step(self, until: float, clock: Callable[[], float]) -> None:
        """Look at entries until the walk is done or ``clock()`` passes ``until``."""
        while not self.done:
            for _ in range(_CLOCK_EVERY):
                entry = self._next()
                if entry is None:
                    break
                self.seen += 1
                if self.seen > self._max_files:
                    self.too_large = True
                    self.close()
                    return
                self._count(entry)
            if clock() >= until:
                return

    def close(self) -> None:
        """Close the directory being listed, if any."""
        if self._listing is not None:
            self._listing.close()
        self._listing = None

    def _next(self) -> os.DirEntry[str] | None:
        """The next entry, opening the next directory when one ends; None when all are read."""
        while True:
            if self._listing is None:
                if not self._pending:
                    return None
                try:
                    self._listing = os.scandir(self._pending.pop())
                except OSError:
                    continue  # an unreadable directory holds no weights we can count
            try:
                return next(self._listing)
            except (StopIteration, OSError):
                self.close()

    def _count(self, entry: os.DirEntry[str]) -> None:
        try:
            # Symlinked directories are not followed (as pathlib's rglob); symlinked files
            # are (a Hugging Face snapshot links its files to the cache's blobs).
            if entry.is_dir(follow_symlinks=False):
                self._pending.append(entry.path)
            elif entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
                self.total += entry.stat().st_size
        except OSError:
            return  # gone or unreadable since it was listed


class ModelSizeSource:
    """Measures one target's model weights; constructed once per target and model path."""

    name: Final = "model_size"

    def __init__(
        self,
        target: str,
        model_path: str,
        *,
        max_files: int = MAX_FILES,
        slice_seconds: float = SLICE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._target = target
        self._path = model_path
        self._max_files = max_files
        self._slice = slice_seconds
        self._clock = clock
        self._walk: _Walk | None = None
        self._size = ModelSize()
        #: ``TargetSeen.starts_finished`` when the last walk began (None: never walked).
        self._walked_for: int | None = None

    def sample(self, deadline: float | None = None, seen: TargetSeen | None = None) -> ModelSize:
        """The last complete measure, after walking for one slice if a walk is due."""
        finished = seen.starts_finished if seen is not None else 0
        if self._walk is None and finished != self._walked_for:
            self._walked_for = finished
            self._walk = self._start()
        if self._walk is not None:
            until = self._clock() + self._slice
            self._walk.step(until if deadline is None else min(until, deadline), self._clock)
            if self._walk.done:
                self._size = self._result(self._walk)
                self._walk = None
        return self._size

    def close(self) -> None:
        """Close a walk's open directory listing."""
        if self._walk is not None:
            self._walk.close()
        self._walk = None

    def _start(self) -> _Walk | None:
        """A new walk; None when the path is a file or absent (measured at once)."""
        try:
            st = os.stat(self._path)
        except OSError:
            self._size = ModelSize()
            return None
        if not os.path.isdir(self._path):
            self._size = ModelSize(st.st_size)
            return None
        return _Walk(self._path, self._max_files)

    def _result(self, walk: _Walk) -> ModelSize:
        if walk.too_large:
            log.warning(
                "model size unknown: more than %d files under the model path target=%s",
                self._max_files,
                self._target,
            )
            return ModelSize()
        return ModelSize(walk.total or None)
