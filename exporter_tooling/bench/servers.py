"""The servers a bench run measures (the exporter, node_exporter), as real processes.

Each is started on a free loopback port, reached over HTTP, measured from outside through
/proc, and stopped when its block ends.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from exporter.render.status_doc import StatusDoc, parse_status_doc
from exporter_tooling.bench import procfs
from exporter_tooling.bench.context import BenchContext
from exporter_tooling.bench.stand_ins import gpu_state_lines
from exporter_tooling.bench.waiting import BenchError, wait_until
from exporter_tooling.fakenvml import STATE_ENV, write_state
from exporter_tooling.processes import free_port, stop_process

# Loopback only: an http_proxy in the environment must not see the bench's requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Server:
    """A server this run started: how to reach it, measure it and stop it."""

    popen: subprocess.Popen[bytes]
    port: int
    name: str
    stderr: Path

    def get(self, path: str, timeout: float = 5.0) -> bytes:
        """GET ``path`` (a new connection each time); raises OSError when it does not answer."""
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with _OPENER.open(url, timeout=timeout) as reply:  # a non-200 raises HTTPError
                body: bytes = reply.read()
                return body
        except http.client.HTTPException as exc:  # a garbled reply: as good as no answer
            raise OSError(f"{self.name} answered {path} badly: {exc!r}") from exc

    def status(self) -> StatusDoc:
        """The exporter's /status document, read as ``wait`` reads it.

        Raises:
            OSError: the exporter does not answer.
            ValueError: it answered something else than a status document.
        """
        return parse_status_doc(json.loads(self.get("/status")))

    def cpu_seconds(self) -> float:
        """User and system CPU of the process and its children (the NVML child), so far."""
        return procfs.cpu_seconds(self.popen.pid) + self.child_cpu_seconds()

    def child_cpu_seconds(self) -> float:
        """CPU of the children only."""
        return sum(procfs.cpu_seconds(c) for c in procfs.children(self.popen.pid))

    def rss_bytes(self) -> int:
        """Resident memory of the process itself (VmRSS)."""
        return procfs.rss_bytes(self.popen.pid)

    def child_rss_bytes(self) -> int:
        """Resident memory of its children together (the NVML child)."""
        return sum(procfs.rss_bytes(c) for c in procfs.children(self.popen.pid))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        stop_process(self.popen)

    def log_tail(self) -> str:
        """The last lines of its stderr, for an error message."""
        with contextlib.suppress(OSError):
            return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-5:])
        return ""


@contextlib.contextmanager
def started(
    argv: list[str], name: str, work: Path, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """Start ``argv`` on a free loopback port (``{port}`` in ``argv``); stop it on exit."""
    port = free_port()
    stderr = work / f"{name}.log"
    with open(stderr, "wb") as err:
        popen = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
    server = Server(popen, port, name, stderr)
    try:
        wait_until(lambda: _answers(server), 30, f"{name} to answer /metrics")
        yield server
    finally:
        server.stop()


def _answers(server: Server) -> bool:
    if server.popen.poll() is not None:
        raise BenchError(f"{server.name} exited: {server.log_tail()}")
    try:
        server.get("/metrics", timeout=2)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def exporter(
    ctx: BenchContext,
    name: str,
    targets: str,
    *,
    interval: float,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """The exporter as a real process with the given ``[[target]]`` tables."""
    work = ctx.next_dir(name)
    config = work / "config.toml"
    config.write_text(
        f'[exporter]\ninterval = "{interval}s"\nstate_directory = "{work / "state"}"\n'
        f'nvml_library_dir = "{ctx.nvml_dir}"\n{targets}'
    )
    argv = [sys.executable, "-m", "exporter", "run", "--config.file", str(config)]
    argv += ["--web.listen-address", "127.0.0.1:{port}", "--log.level", "warn"]
    with started(argv, name, work, env) as server:
        yield server


def _farm_targets_toml(ctx: BenchContext, count: int) -> str:
    parts = []
    for t in ctx.farm.targets[:count]:
        parts.append(
            f'[[target]]\nname = "{t.name}"\nengine = "vllm"\nbase_url = "{ctx.health.url}"\n'
            f'pidfile = "{t.pidfile}"\nlog_file = "{t.log_file}"\n'
        )
    return "\n".join(parts)


@contextlib.contextmanager
def farm_exporter(ctx: BenchContext, name: str, count: int) -> Iterator[Server]:
    """An exporter watching ``count`` idle trees and ``sizes.gpus`` simulated GPUs, settled."""
    work = ctx.next_dir(f"{name}-gpus")
    state = work / "gpus.state"
    write_state(state, gpu_state_lines(ctx.farm.targets[:count], ctx.sizes.gpus))
    toml = _farm_targets_toml(ctx, count)
    env = {STATE_ENV: str(state)}
    with exporter(ctx, name, toml, interval=ctx.sizes.interval, env=env) as server:
        wait_until(lambda: _settled(server, count, ctx.sizes.gpus), 60, f"{name} to settle")
        yield server


def _settled(server: Server, targets: int, gpus: int) -> bool:
    """Every target ready with its whole tree, every GPU up: the steady state we measure."""
    try:
        doc = server.status()
    except (OSError, ValueError):
        return False
    ready = [t for t in doc["targets"] if t["phase"] == "ready" and t["process"]]
    up = [g for g in doc["gpus"] if g["up"]]
    return len(ready) == targets and len(up) == gpus
