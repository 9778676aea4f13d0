"""Child processes the tooling starts: a free loopback port for each server, and a clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess
from typing import AnyStr


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop_process(proc: subprocess.Popen[AnyStr], timeout: float = 10.0) -> None:
    """SIGTERM ``proc`` and wait for it; SIGKILL it after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
