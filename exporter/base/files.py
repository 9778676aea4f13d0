"""Which file a path names right now: to tell a file changed, replaced or truncated."""

from __future__ import annotations

import os
from typing import NamedTuple


class FileIdentity(NamedTuple):
    """What a stat says about a file: equal identities mean the same, unchanged file."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def file_identity(path: str | None) -> FileIdentity | None:
    """The identity of the file at ``path``; None when there is no path or no such file."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
