"""A file's identity tells the same unchanged file from a changed, replaced or deleted one."""

from __future__ import annotations

import os

from exporter.base.files import file_identity


def test_identity_follows_what_happens_to_the_file(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"12345")
    first = file_identity(str(path))
    assert first is not None and first == file_identity(str(path))
    assert first.size == 5
    with open(path, "r+b") as f:
        f.truncate(2)
    truncated = file_identity(str(path))
    assert truncated is not None and truncated.size == 2 and truncated.inode == first.inode
    other = tmp_path / "other"
    other.write_bytes(b"x")
    os.replace(other, path)
    replaced = file_identity(str(path))
    assert replaced is not None and replaced.inode != first.inode
    path.unlink()
    assert file_identity(str(path)) is None
    assert file_identity(None) is None
