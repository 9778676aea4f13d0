"""Idle stand-ins for what the exporter watches: process trees, a health endpoint, GPUs.

Engines are too costly to run by the dozen; what the sampling loop sees of them (a process tree,
a health endpoint answering 200, GPUs holding memory) is cheap to fake faithfully.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

from exporter_tooling.bench.procfs import children
from exporter_tooling.bench.waiting import wait_until
from exporter_tooling.fakenvml import gpu_line, proc_line

# Idle stand-ins outlive any run (the full one takes under 10 minutes) but not by a day,
# should this process be killed before it can stop them.
_IDLE_SECONDS: Final = 1800
_GPU_TOTAL: Final = 80 * 2**30
_GPU_USED_PER_PROCESS: Final = 70 * 2**30


@dataclass(frozen=True, slots=True)
class FarmTarget:
    """One idle process tree standing in for an engine: a main process and its workers."""

    name: str
    main_pid: int
    workers: tuple[int, ...]
    pidfile: Path
    log_file: Path


class Farm:
    """Idle process trees (a shell and its ``sleep`` children) and unrelated host processes.

    Each tree is its own session, so one ``killpg`` by its id stops it and its children.
    """

    def __init__(self, work: Path) -> None:
        self._work = work
        self._groups: list[subprocess.Popen[bytes]] = []
        self.targets: list[FarmTarget] = []

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self, targets: int, per_target: int, host: int) -> None:
        """Start the trees and wait until every child is running."""
        self._work.mkdir(parents=True, exist_ok=True)
        mains = [self._spawn(per_target) for _ in range(targets)]
        if host:
            self._spawn(host)
        for proc in self._groups:
            expected = per_target if proc in mains else host
            wait_until(_has_children(proc.pid, expected), 30, "the idle trees to start")
        for i, proc in enumerate(mains):
            self.targets.append(self._describe(f"t{i}", proc.pid))

    def close(self) -> None:
        """Stop every tree (SIGKILL to each session this farm started)."""
        for proc in self._groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._groups.clear()

    def _spawn(self, count: int) -> subprocess.Popen[bytes]:
        script = f"i=0; while [ $i -lt {count} ]; do sleep {_IDLE_SECONDS} & i=$((i+1)); done; wait"
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, start_new_session=True
        )
        self._groups.append(proc)
        return proc

    def _describe(self, name: str, pid: int) -> FarmTarget:
        pidfile, log_file = self._work / f"{name}.pid", self._work / f"{name}.log"
        pidfile.write_text(f"{pid}\n")
        log_file.touch()
        return FarmTarget(name, pid, tuple(sorted(children(pid))), pidfile, log_file)


def _has_children(pid: int, count: int) -> Callable[[], bool]:
    return lambda: len(children(pid)) >= count


class _HealthHandler(BaseHTTPRequestHandler):
    """A ready vLLM started with its default flags: ``/health`` 200, any other path 404.

    Without ``VLLM_SERVER_DEV_MODE=1`` vLLM offers no ``/is_sleeping``, so the prober asks it
    once and then every few minutes, as on a production server (a 200 without the field
    would be asked every tick, as a dev-mode server is).

    HTTP/1.1 with keep-alive, as the engines' own servers (uvicorn, axum, cpp-httplib) answer:
    an HTTP/1.0 stand-in would make every probe pay for a new connection no engine costs.
    """

    protocol_version = "HTTP/1.1"  # keep-alive: every reply has a Content-Length
    # TCP_NODELAY, as uvicorn's asyncio transports set: the head and the body are two writes,
    # and on a kept connection Nagle held the body back for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        """Answer 200 ``{}`` at /health, 404 elsewhere."""
        status, body = (200, b"{}") if self.path == "/health" else (404, b'{"detail":"Not Found"}')
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet: one line per probe would drown the table."""


class _HealthHttpd(ThreadingHTTPServer):
    """A thread per connection; a backlog that holds every target's connect at once."""

    daemon_threads = True  # a kept connection's thread waits for its next request: not joined
    # Python's default of 5 made probes time out against the stand-in at 16+ targets.
    request_queue_size = 128


class HealthServer:
    """The health endpoint every idle tree's target is probed at, served from a thread."""

    def __init__(self) -> None:
        self._server = _HealthHttpd(("127.0.0.1", 0), _HealthHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Base URL of the endpoint."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HealthServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def gpu_state_lines(targets: Sequence[FarmTarget], gpus: int) -> list[str]:
    """Simulated NVML state: ``gpus`` GPUs dealt round-robin to the targets' workers.

    Each GPU is held by one worker of its target, as a tensor-parallel engine holds one GPU
    per worker, so the exporter attributes every GPU's memory to a target.
    """
    lines = []
    for index in range(gpus):
        uuid = f"GPU-00000000-0000-4000-8000-{index:012x}"
        used = _GPU_USED_PER_PROCESS if targets else 0
        lines.append(gpu_line(index, uuid, "NVIDIA_H100_80GB_HBM3", _GPU_TOTAL, used))
        if targets:
            owner = targets[index % len(targets)]
            pid = owner.workers[(index // len(targets)) % len(owner.workers)]
            lines.append(proc_line(index, pid, _GPU_USED_PER_PROCESS))
    return lines
