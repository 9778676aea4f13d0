"""The host's time zone, read by the shell and handed to the core (which never reads it)."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo


def local_zone() -> tzinfo:
    """The zone engines print their zone-less log timestamps in: the host's, as of now.

    A fixed offset: a start that spans a daylight-saving change reads an hour off on one
    side of it, as the engine's own stamps do.
    """
    return datetime.now().astimezone().tzinfo or UTC


def local_utc_offset_seconds() -> float:
    """``local_zone``'s offset from UTC, in seconds east."""
    offset = datetime.now().astimezone().utcoffset()
    return offset.total_seconds() if offset is not None else 0.0
