"""Downloads in progress that a process tree holds open: the model is not local yet.

huggingface_hub writes each file as ``blobs/<hash>.incomplete`` and renames it when done;
Ollama writes ``<blob>-partial``; curl, wget and aria2 write ``.part`` or ``.download``
files. A tree writing to such a file is downloading, not loading.

Looking costs a readlink per open descriptor, so it is done only while the tree writes
(its ``write_bytes`` grew) or while a download is known, and at most every ``every_seconds``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Final

from exporter.sources.process.procfs import PROC

#: The name a downloader gives a file it is still writing.
IN_PROGRESS: Final = re.compile(r"(?:\.incomplete|\.part|\.download|[.-]partial(?:-\d+)?)$")
#: How many descriptors one look reads at most (a tree with huge fd tables stays cheap).
MAX_DESCRIPTORS: Final = 4096
LOOK_EVERY_SECONDS: Final = 5.0


class DownloadWatch:
    """How many download files one tree holds open, looked for only when it may matter."""

    def __init__(
        self,
        every_seconds: float = LOOK_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._every = every_seconds
        self._clock = clock
        self._looked_at = -float("inf")
        self._written: int | None = None
        self._found = 0

    def count(self, pids: Iterable[int], written: int | None) -> int:
        """Download files open in ``pids`` now (or as of the last look, seconds ago)."""
        wrote = written is not None and self._written is not None and written > self._written
        self._written = written
        now = self._clock()
        if (wrote or self._found) and now - self._looked_at >= self._every:
            self._looked_at = now
            self._found = open_downloads(pids)
        elif not wrote and not self._found:
            self._found = 0
        return self._found


def open_downloads(pids: Iterable[int]) -> int:
    """Distinct download files open in ``pids``; a process that went away counts nothing."""
    found: set[str] = set()
    budget = MAX_DESCRIPTORS
    for pid in pids:
        fd_dir = f"{PROC}/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:  # ended, or not ours to look at
            continue
        for name in names[:budget]:
            try:
                path = os.readlink(f"{fd_dir}/{name}")
            except OSError:
                continue
            if IN_PROGRESS.search(path):
                found.add(path)
        budget -= min(len(names), budget)
        if budget <= 0:
            break
    return len(found)
