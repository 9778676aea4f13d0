"""A target's API key, read from ``api_key_file`` or ``api_key_env``; never shown anywhere.

The probes read it once when a target is set up; ``check-config`` reads it to say early
what the probes would refuse.
"""

from __future__ import annotations

import os
import stat

from exporter.base.errors import ConfigError
from exporter.config.schema import Target


def _read_key_file(path: str) -> str:
    try:
        with open(path, "rb") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            if mode & stat.S_IROTH:
                raise ConfigError(
                    path, "api_key_file", f"is readable by other users (mode {mode:04o}); chmod 600"
                )
            raw = f.read(4097)
    except OSError as exc:
        raise ConfigError(path, "api_key_file", f"cannot read: {exc.strerror}") from None
    return raw.decode("ascii", errors="replace").strip()  # U+FFFD fails the ASCII check


def load_api_key(target: Target) -> str | None:
    """The target's API key from ``api_key_file`` or ``api_key_env``; None when neither is set.

    The key never appears in an error message.

    Raises:
        ConfigError: the file is readable by other users, unreadable, or the key is empty
            or not one line of printable ASCII; or the environment variable is unset.
    """
    if target.api_key_file:
        where, field = target.api_key_file, "api_key_file"
        key = _read_key_file(target.api_key_file)
    elif target.api_key_env:
        where, field = f"${target.api_key_env}", "api_key_env"
        key = os.environ.get(target.api_key_env, "").strip()
    else:
        return None
    if not key:
        raise ConfigError(where, field, "is empty or not set")
    if len(key) > 4096 or not (key.isascii() and key.isprintable()) or " " in key:
        raise ConfigError(where, field, "must hold one line of printable ASCII without spaces")
    return key
