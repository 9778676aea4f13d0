"""The loop pings the systemd watchdog often enough even when its interval is longer."""

from __future__ import annotations

import socket
import threading
import time

from exporter.config import Settings
from exporter.daemon import Daemon
from exporter.history import History
from exporter.sdnotify import Notifier


def test_a_long_interval_still_pings_the_watchdog_at_half_its_period(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
        daemon = Daemon(
            Settings(interval_seconds=3.0, state_directory=str(tmp_path), nvml=False),
            history=History.open(None),
            notifier=notifier,
        )
        stop = threading.Event()
        loop = threading.Thread(target=daemon.run, args=(stop,))
        loop.start()
        try:
            messages, started = [], time.monotonic()
            while time.monotonic() - started < 1.5:
                messages.append(sock.recv(4096).decode())
        finally:
            stop.set()
            loop.join()
            daemon.close()
        assert messages[0].startswith("READY=1")
        pings = [m for m in messages if m.startswith("WATCHDOG=1")]
        # a 3 s interval, a 0.4 s watchdog: pings every 0.2 s between ticks
        assert len(pings) >= 4, messages
