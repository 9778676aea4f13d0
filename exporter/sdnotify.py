"""sd_notify over ``$NOTIFY_SOCKET``: READY, WATCHDOG, STATUS and STOPPING for systemd.

A no-op without ``NOTIFY_SOCKET``. Watchdog pings are sent from the sampling loop itself,
so a wedged loop stops them and systemd restarts the daemon.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends datagrams to systemd's notify socket, if there is one."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self._address = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_seconds = _watchdog_seconds(env)
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        """True when a notify socket was given."""
        return self._address is not None

    def notify(self, *fields: str) -> None:
        """Send one datagram of ``KEY=value`` lines; failures are logged once, never raised."""
        if self._address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.sendto("\n".join(fields).encode(), self._address)
        except OSError as exc:
            if not self._warned:
                log.warning("sd_notify failed error=%s", exc.strerror)
                self._warned = True

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _socket_address(value: str) -> str | None:
    if not value or value[0] not in "/@":
        return None
    # A leading "@" names a socket in the abstract namespace (a NUL byte on the wire).
    return "\0" + value[1:] if value[0] == "@" else value


def _watchdog_seconds(env: dict[str, str]) -> float | None:
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None  # the watchdog is meant for another process
    return int(usec) / 1_000_000
