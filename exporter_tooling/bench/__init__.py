"""The ``bench`` subcommand: scrape latency, sampling cost, memory and detection times.

Starts everything it measures as real processes (idle process trees, the exporter, simulators,
node_exporter, scrape clients) and measures them from outside, through /proc and HTTP. It
writes only its work directory and the JSON report, and stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, TypeVar

from exporter import __version__

log = logging.getLogger(__name__)
T = TypeVar("T")

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
DEFAULT_OUT: Final = "artifacts/bench.json"
NODE_EXPORTER: Final = "/usr/bin/prometheus-node-exporter"
SECTIONS: Final = ("scrape", "sampling", "ready", "stall")
# What Prometheus 3 sends on every scrape (scrape/scrape.go), with gzip as it asks by default.
SCRAPE_ACCEPT: Final = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
MIB: Final = 2**20
# Idle stand-ins outlive any run (the full one takes under 10 minutes) but not by a day,
# should this process be killed before it can stop them.
_IDLE_SECONDS: Final = 1800
_POLL: Final = 0.02
_GPU_TOTAL: Final = 80 * 2**30
_GPU_USED_PER_PROCESS: Final = 70 * 2**30

EPILOG: Final = """exit codes:
  0  every section ran (a goal may still be missed: see the table and the JSON "goals")
  1  a section could not run (a process did not start or answer; see the message)
  2  usage error

sections: scrape (latency sequential and under concurrent scrapers, CPU per scrape, RSS over
the sequential scrapes, node_exporter the same way), sampling (CPU of the exporter and its
NVML child per tick, for the cost curve over targets), ready (simulator ready -> exporter
ready), stall (hang -> stall flag).
"""


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big each measurement is; ``QUICK`` shrinks everything to seconds for a smoke test."""

    procs_per_target: int = 64
    host_procs: int = 500
    gpus: int = 8
    interval: float = 1.0
    scrape_targets: int = 2
    scrapes: int = 100_000
    scrapers: int = 8
    concurrent_seconds: float = 10.0
    node_scrapes: int = 3_000
    sampling_targets: int = 8
    sampling_seconds: float = 30.0
    curve: tuple[int, ...] = (0, 1, 2, 4, 8)
    curve_seconds: float = 15.0
    starts: int = 20
    ready_intervals: tuple[float, ...] = (1.0, 0.25)
    stalls: int = 2
    stall_threshold: float = 3.0
    stall_intervals: tuple[float, ...] = (1.0, 0.25)

    @property
    def farm_targets(self) -> int:
        """Process trees the run needs at most at once."""
        return max(self.scrape_targets, self.sampling_targets, *self.curve)


QUICK: Final = Sizes(
    procs_per_target=4,
    host_procs=20,
    scrapes=300,
    concurrent_seconds=1.0,
    node_scrapes=100,
    sampling_targets=2,
    sampling_seconds=3.0,
    curve=(1, 2),
    curve_seconds=2.0,
    starts=2,
    ready_intervals=(0.25,),
    stalls=1,
    stall_threshold=1.0,
    stall_intervals=(0.25,),
)


class BenchError(Exception):
    """A measurement could not be taken (a process did not start or answer)."""


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``bench``."""
    p.epilog = EPILOG
    p.add_argument("--out", default=DEFAULT_OUT, help=f"JSON report path (default {DEFAULT_OUT})")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: runs in seconds to prove the bench works; its figures mean little",
    )
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})",
    )
    p.add_argument("--scrapes", type=int, help="sequential scrapes (default 100000)")
    p.add_argument("--starts", type=int, help="simulated cold starts per interval (default 20)")
    p.add_argument(
        "--node-exporter",
        default=NODE_EXPORTER,
        help=f"node_exporter binary to compare with (default {NODE_EXPORTER})",
    )
    p.add_argument(
        "--work-dir",
        help="keep configs and process logs here (default: a temporary directory, removed)",
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="after the measured windows, record the exporter with py-spy into DIR",
    )


def run(args: argparse.Namespace) -> int:
    """Run the chosen sections, print the table, write the JSON report."""
    from exporter.cli import configure_logging

    configure_logging("warn", "logfmt")
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        known = ",".join(SECTIONS)
        print(f"bench: --only: unknown section {unknown[0]!r}; known: {known}", file=sys.stderr)
        return 2
    sizes = _sizes(args)
    with _work_dir(args.work_dir) as work:
        try:
            report = measure(
                sizes,
                sections,
                work,
                node_exporter=args.node_exporter,
                profile_dir=Path(args.profile).resolve() if args.profile else None,
            )
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return EXIT_FAILED
    report["command"] = " ".join(["inference-lifecycle-exporter", *sys.argv[1:]])
    print(render_table(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"bench: report written to {out}")
    return EXIT_OK


def _sizes(args: argparse.Namespace) -> Sizes:
    base = QUICK if args.quick else Sizes()
    changes: dict[str, Any] = {}
    if args.scrapes is not None:
        changes["scrapes"] = max(1, args.scrapes)
    if args.starts is not None:
        changes["starts"] = max(1, args.starts)
    return Sizes(**{**asdict(base), **changes})


@contextlib.contextmanager
def _work_dir(given: str | None) -> Iterator[Path]:
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="inference-lifecycle-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- the run -----------------------------------------------------------------------------


@dataclass
class _Context:
    """What every section shares: sizes, the work directory, the farm and the NVML library."""

    sizes: Sizes
    work: Path
    farm: _Farm
    health: _HealthServer
    nvml_dir: Path
    node_exporter: str
    profile_dir: Path | None = None
    profiles: dict[str, str] = field(default_factory=dict)
    counter: int = 0

    def next_dir(self, name: str) -> Path:
        """A fresh directory for one exporter or simulator run."""
        self.counter += 1
        path = self.work / f"{self.counter:02d}-{name}"
        path.mkdir(parents=True)
        return path


def measure(
    sizes: Sizes,
    sections: Sequence[str],
    work: Path,
    *,
    node_exporter: str = NODE_EXPORTER,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """Run ``sections`` and return the report (figures, goals, host facts).

    Args:
        sizes: how long and how big each measurement is.
        sections: which of ``SECTIONS`` to run, in order.
        work: where configs, state and process logs go.
        node_exporter: the binary to compare scrapes with.
        profile_dir: when given, py-spy records the exporter after the measured windows
            (sampling at full size, and under sequential scrapes) into speedscope files here.

    Raises:
        BenchError: a process the run needs did not start or answer.
    """
    from exporter_tooling.fakenvml import SimulatedNvmlBuildError, build_simulated_nvml

    started = time.monotonic()
    report: dict[str, Any] = {"host": _host_facts(), "sizes": asdict(sizes)}
    try:
        nvml_dir = build_simulated_nvml(work / "nvml").parent
    except SimulatedNvmlBuildError as exc:
        raise BenchError(f"cannot build the simulated NVML library: {exc}") from exc
    with _Farm(work / "farm") as farm, _HealthServer() as health:
        farm.start(sizes.farm_targets, sizes.procs_per_target, sizes.host_procs)
        ctx = _Context(sizes, work, farm, health, nvml_dir, node_exporter, profile_dir)
        for section in sections:
            section_started = time.monotonic()
            report[section] = _SECTION_RUNNERS[section](ctx)
            report[section]["seconds"] = round(time.monotonic() - section_started, 1)
    if ctx.profiles:
        report["profiles"] = ctx.profiles
    report["host"]["load_average_after"] = list(os.getloadavg())
    report["seconds"] = round(time.monotonic() - started, 1)
    report["goals"] = evaluate_goals(report, sizes)
    return report


def _host_facts() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average_before": list(os.getloadavg()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "exporter_version": __version__,
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.machine()


# --- idle stand-ins: process trees, a health endpoint, simulated GPUs -------------------------


@dataclass(frozen=True, slots=True)
class FarmTarget:
    """One idle process tree standing in for an engine: a main process and its workers."""

    name: str
    main_pid: int
    workers: tuple[int, ...]
    pidfile: Path
    log_file: Path


class _Farm:
    """Idle process trees (a shell and its ``sleep`` children) and unrelated host processes.

    Each tree is its own session, so one ``killpg`` by its id stops it and its children.
    """

    def __init__(self, work: Path) -> None:
        self._work = work
        self._groups: list[subprocess.Popen[bytes]] = []
        self.targets: list[FarmTarget] = []

    def __enter__(self) -> _Farm:
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
            _wait_until(_has_children(proc.pid, expected), 30, "the idle trees to start")
        for i, proc in enumerate(mains):
            self.targets.append(self._describe(f"t{i}", proc.pid))

    def close(self) -> None:
        """Stop every tree (SIGKILL to each session this farm started)."""
        for proc in self._groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._groups.clear()

    def _spawn(self, children: int) -> subprocess.Popen[bytes]:
        script = (
            f"i=0; while [ $i -lt {children} ]; do sleep {_IDLE_SECONDS} & i=$((i+1)); done; wait"
        )
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, start_new_session=True
        )
        self._groups.append(proc)
        return proc

    def _describe(self, name: str, pid: int) -> FarmTarget:
        pidfile, log_file = self._work / f"{name}.pid", self._work / f"{name}.log"
        pidfile.write_text(f"{pid}\n")
        log_file.touch()
        return FarmTarget(name, pid, tuple(sorted(_children(pid))), pidfile, log_file)


def _has_children(pid: int, count: int) -> Callable[[], bool]:
    return lambda: len(_children(pid)) >= count


class _HealthHandler(BaseHTTPRequestHandler):
    """Answers every GET with 200 and ``{}``: a ready engine's health endpoint."""

    def do_GET(self) -> None:
        """Answer 200."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: one line per probe would drown the table."""


class _HealthServer:
    """The health endpoint every idle tree's target is probed at, served from a thread."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _HealthHandler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Base URL of the endpoint."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> _HealthServer:
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
        lines.append(f"gpu {index} {uuid} NVIDIA_H100_80GB_HBM3 {_GPU_TOTAL} {used} 0 0")
        if targets:
            owner = targets[index % len(targets)]
            pid = owner.workers[(index // len(targets)) % len(owner.workers)]
            lines.append(f"proc {index} {pid} {_GPU_USED_PER_PROCESS}")
    return lines


# --- processes under measurement ---------------------------------------------------------------


@dataclass
class _Server:
    """A server this run started: how to reach it, measure it and stop it."""

    popen: subprocess.Popen[bytes]
    port: int
    name: str
    stderr: Path

    def get(self, path: str, timeout: float = 5.0) -> bytes:
        """GET ``path`` (a new connection each time); raises OSError when it does not answer."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            sock.sendall(request.encode())
            reply = bytearray()
            while chunk := sock.recv(1 << 16):
                reply += chunk
        head, _, body = bytes(reply).partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        if status != 200:
            raise OSError(f"{self.name} answered {path} with {status}")
        return _dechunk(body) if b"chunked" in head.lower() else body

    def status(self) -> dict[str, Any]:
        """The exporter's /status document."""
        doc: dict[str, Any] = json.loads(self.get("/status"))
        return doc

    def cpu_seconds(self) -> float:
        """User and system CPU of the process and its children (the NVML child), so far."""
        return _cpu_seconds(self.popen.pid) + sum(
            _cpu_seconds(c) for c in _children(self.popen.pid)
        )

    def child_cpu_seconds(self) -> float:
        """CPU of the children only."""
        return sum(_cpu_seconds(c) for c in _children(self.popen.pid))

    def rss_bytes(self) -> int:
        """Resident memory of the process itself (VmRSS)."""
        return _rss_bytes(self.popen.pid)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        _stop(self.popen)

    def log_tail(self) -> str:
        """The last lines of its stderr, for an error message."""
        with contextlib.suppress(OSError):
            return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-5:])
        return ""


def _dechunk(body: bytes) -> bytes:
    out, rest = bytearray(), body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out)


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _started(
    argv: list[str], name: str, work: Path, env: dict[str, str] | None = None
) -> Iterator[_Server]:
    """Start a server listening on a free loopback port; stop it on exit."""
    port = _free_port()
    stderr = work / f"{name}.log"
    with open(stderr, "wb") as err:
        popen = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
    server = _Server(popen, port, name, stderr)
    try:
        _wait_until(lambda: _answers(server), 30, f"{name} to answer /metrics")
        yield server
    finally:
        server.stop()


def _answers(server: _Server) -> bool:
    if server.popen.poll() is not None:
        raise BenchError(f"{server.name} exited: {server.log_tail()}")
    try:
        server.get("/metrics", timeout=2)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _exporter(
    ctx: _Context, name: str, targets: str, *, interval: float, env: dict[str, str] | None = None
) -> Iterator[_Server]:
    """The exporter as a real process with the given ``[[target]]`` tables."""
    work = ctx.next_dir(name)
    config = work / "config.toml"
    config.write_text(
        f'[exporter]\ninterval = "{interval}s"\nstate_directory = "{work / "state"}"\n'
        f'nvml_library_dir = "{ctx.nvml_dir}"\n{targets}'
    )
    argv = [sys.executable, "-m", "exporter", "run", "--config.file", str(config)]
    argv += ["--web.listen-address", "127.0.0.1:{port}", "--log.level", "warn"]
    with _started(argv, name, work, env) as server:
        yield server


def _farm_targets_toml(ctx: _Context, count: int) -> str:
    parts = []
    for t in ctx.farm.targets[:count]:
        parts.append(
            f'[[target]]\nname = "{t.name}"\nengine = "vllm"\nbase_url = "{ctx.health.url}"\n'
            f'pidfile = "{t.pidfile}"\nlog_file = "{t.log_file}"\n'
        )
    return "\n".join(parts)


@contextlib.contextmanager
def _farm_exporter(ctx: _Context, name: str, count: int) -> Iterator[_Server]:
    """An exporter watching ``count`` idle trees and ``sizes.gpus`` simulated GPUs, settled."""
    from exporter_tooling.fakenvml import write_state

    work = ctx.next_dir(f"{name}-gpus")
    state = work / "gpus.state"
    write_state(state, gpu_state_lines(ctx.farm.targets[:count], ctx.sizes.gpus))
    toml = _farm_targets_toml(ctx, count)
    env = {"SIMULATED_NVML_STATE": str(state)}
    with _exporter(ctx, name, toml, interval=ctx.sizes.interval, env=env) as server:
        _wait_until(lambda: _settled(server, count, ctx.sizes.gpus), 60, f"{name} to settle")
        yield server


def _settled(server: _Server, targets: int, gpus: int) -> bool:
    """Every target ready with its whole tree, every GPU up: the steady state we measure."""
    try:
        doc = server.status()
    except (OSError, ValueError):
        return False
    ready = [t for t in doc["targets"] if t["phase"] == "ready" and t["process"]]
    up = [g for g in doc["gpus"] if g["up"]]
    return len(ready) == targets and len(up) == gpus


# --- the scrape client (runs in its own process: its CPU must not count) ------------------


class Scraper:
    """One keep-alive HTTP/1.1 connection that asks the way Prometheus does (gzip, OpenMetrics)."""

    def __init__(self, port: int, path: str = "/metrics", timeout: float = 10.0) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: Prometheus/3.0.0\r\n"
            f"Accept: {SCRAPE_ACCEPT}\r\nAccept-Encoding: gzip\r\n"
            "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
        ).encode()
        self._buffer = b""

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def scrape(self) -> int:
        """One request; returns the body's size. Raises OSError on anything but a 200."""
        self._sock.sendall(self._request)
        head = self._until(b"\r\n\r\n").lower()
        if not head.startswith(b"http/1.1 200"):
            raise OSError(f"scrape answered {head[:40]!r}")
        length = _header(head, b"content-length")
        if length is not None:
            return len(self._exactly(int(length)))
        if _header(head, b"transfer-encoding") == b"chunked":
            return self._chunked()
        raise OSError("scrape reply has neither a length nor chunks")

    def _fill(self) -> None:
        data = self._sock.recv(1 << 18)
        if not data:
            raise ConnectionError("server closed the connection")
        self._buffer += data

    def _until(self, marker: bytes) -> bytes:
        while marker not in self._buffer:
            self._fill()
        head, _, self._buffer = self._buffer.partition(marker)
        return head

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        body, self._buffer = self._buffer[:size], self._buffer[size:]
        return body

    def _chunked(self) -> int:
        total = 0
        while size := int(self._until(b"\r\n").split(b";")[0], 16):
            total += len(self._exactly(size))
            self._exactly(2)
        self._until(b"\r\n")  # no trailers: the empty line ends the body
        return total


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip() == name:
            return value.strip()
    return None


def _scrape_sequential(port: int, count: int) -> dict[str, Any]:
    scraper = Scraper(port)
    latencies, size = [], 0
    started = time.perf_counter()
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            size = scraper.scrape()
            latencies.append(time.perf_counter() - t0)
    finally:
        scraper.close()
    return latency_summary(latencies, time.perf_counter() - started, 0) | {"body_bytes": size}


def _scrape_concurrent(port: int, scrapers: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = [0]
    deadline = time.perf_counter() + seconds

    def scrape_until_deadline() -> None:
        scraper, mine = Scraper(port), []
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                scraper.scrape()
            except OSError:
                errors[0] += 1
                scraper.close()
                scraper = Scraper(port)
                continue
            mine.append(time.perf_counter() - t0)
        scraper.close()
        latencies.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=scrape_until_deadline) for _ in range(scrapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latency_summary(latencies, time.perf_counter() - started, errors[0])


def latency_summary(latencies: list[float], elapsed: float, errors: int) -> dict[str, Any]:
    """Count, rate and percentiles (milliseconds) of request latencies."""
    ordered = sorted(latencies)
    return {
        "count": len(ordered),
        "errors": errors,
        "seconds": round(elapsed, 3),
        "per_second": round(len(ordered) / elapsed, 1) if elapsed > 0 else None,
        "p50_ms": _ms(percentile(ordered, 50)),
        "p90_ms": _ms(percentile(ordered, 90)),
        "p99_ms": _ms(percentile(ordered, 99)),
        "max_ms": _ms(ordered[-1] if ordered else None),
    }


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values; None when there are none."""
    if not ordered:
        return None
    rank = max(1, int(-(-q * len(ordered) // 100)))
    return ordered[min(rank, len(ordered)) - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def client_main(argv: Sequence[str]) -> int:
    """Entry of the scrape client process: one JSON spec in, one JSON summary line out."""
    spec = json.loads(argv[0])
    if spec["mode"] == "sequential":
        result = _scrape_sequential(spec["port"], spec["count"])
    else:
        result = _scrape_concurrent(spec["port"], spec["scrapers"], spec["seconds"])
    print(json.dumps(result), flush=True)
    return 0


def _run_client(
    spec: dict[str, Any], watch: Callable[[], None] | None = None, every: float = 0.5
) -> dict[str, Any]:
    """Run the scrape client in a child process; call ``watch`` every ``every`` s meanwhile."""
    argv = [sys.executable, "-m", "exporter_tooling.bench", json.dumps(spec)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        while proc.poll() is None:
            if watch is not None:
                watch()
            _readable(proc.stdout.fileno(), every)
        out = proc.stdout.read()
    if proc.returncode != 0 or not out.strip():
        raise BenchError(f"scrape client failed (exit {proc.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


def _readable(fd: int, timeout: float) -> bool:
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable)


# --- section: scrape --------------------------------------------------------------------------


def _scrape_section(ctx: _Context) -> dict[str, Any]:
    sizes = ctx.sizes
    with _farm_exporter(ctx, "scrape", sizes.scrape_targets) as exp:
        time.sleep(2 * sizes.interval)  # a few ticks: steady memory
        exporter = _scrape_server(exp, sizes.scrapes, sizes, memory=True)
        if ctx.profile_dir is not None:
            ctx.profiles["scrape"] = _profile_scrapes(exp, ctx.profile_dir / "scrape", sizes)
    node = _node_exporter_figures(ctx)
    section: dict[str, Any] = {
        "targets": sizes.scrape_targets,
        "gpus": sizes.gpus,
        "exporter": exporter,
        "node_exporter": node,
    }
    if "sequential" in node:
        section["node_over_exporter_p50"] = _ratio(node, exporter, "p50_ms")
        section["node_over_exporter_p99"] = _ratio(node, exporter, "p99_ms")
    return section


def _scrape_server(server: _Server, scrapes: int, sizes: Sizes, *, memory: bool) -> dict[str, Any]:
    """Sequential scrapes (with CPU per scrape and RSS over them), then concurrent ones."""
    rss: list[int] = [server.rss_bytes()]
    cpu0 = server.cpu_seconds()
    spec: dict[str, Any] = {"mode": "sequential", "port": server.port, "count": scrapes}
    sequential = _run_client(spec, watch=lambda: rss.append(server.rss_bytes()))
    rss.append(server.rss_bytes())
    cpu_ms = (server.cpu_seconds() - cpu0) * 1000 / max(1, int(sequential["count"]))
    sequential["cpu_per_scrape_ms"] = round(cpu_ms, 3)
    spec = {"mode": "concurrent", "port": server.port, "scrapers": sizes.scrapers}
    concurrent = _run_client(spec | {"seconds": sizes.concurrent_seconds})
    concurrent["scrapers"] = sizes.scrapers
    return {
        "sequential": sequential,
        "concurrent": concurrent,
        "memory": _rss_figures(rss, server, scrapes) if memory else {},
        "rss_mib": round(server.rss_bytes() / MIB, 1),
    }


def _rss_figures(rss: list[int], server: _Server, scrapes: int) -> dict[str, Any]:
    """RSS before and after the scrapes; growth is measured past the first tenth (warm-up)."""
    warm = rss[max(1, len(rss) // 10)] if len(rss) > 2 else rss[0]
    children = [_rss_bytes(c) for c in _children(server.popen.pid)]
    return {
        "scrapes": scrapes,
        "rss_after_start_mib": round(rss[0] / MIB, 1),
        "rss_after_scrapes_mib": round(rss[-1] / MIB, 1),
        "rss_max_mib": round(max(rss) / MIB, 1),
        "rss_growth_after_warmup_mib": round((rss[-1] - warm) / MIB, 2),
        "nvml_child_rss_mib": round(sum(children) / MIB, 1),
    }


def _profile_scrapes(server: _Server, out: Path, sizes: Sizes) -> str:
    spec = {"mode": "concurrent", "port": server.port, "scrapers": 1}
    seconds = max(5.0, sizes.concurrent_seconds)
    argv = [sys.executable, "-m", "exporter_tooling.bench", json.dumps(spec | {"seconds": seconds})]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL) as client:
        result = _py_spy(server, out, seconds)
        client.wait()
    return result


def _py_spy(server: _Server, out: Path, seconds: float) -> str:
    """Record ``server`` (and its NVML child) with py-spy; the file written, or why not."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(exe, os.X_OK):
        return "py-spy not found (pip install py-spy)"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [exe, "record", "--pid", str(server.popen.pid), "--subprocesses", "--nonblocking"]
    argv += ["--rate", "200", "--duration", str(max(1, round(seconds))), "--format", "speedscope"]
    done = subprocess.run(
        [*argv, "-o", f"{out}.speedscope.json"],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    if done.returncode != 0:
        return f"py-spy failed: {done.stderr.strip()[-300:]}"
    return f"{out}.speedscope.json"


def _node_exporter_figures(ctx: _Context) -> dict[str, Any]:
    path = ctx.node_exporter
    if not os.access(path, os.X_OK):
        return {"error": f"{path} not found (Debian package prometheus-node-exporter)"}
    argv = [path, "--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with _started(argv, "node_exporter", ctx.next_dir("node_exporter")) as node:
        node.get("/metrics")  # its first scrape sets collectors up
        return _scrape_server(node, ctx.sizes.node_scrapes, ctx.sizes, memory=False)


def _ratio(node: dict[str, Any], ours: dict[str, Any], key: str) -> float | None:
    a, b = node["sequential"].get(key), ours["sequential"].get(key)
    return round(a / b, 1) if a and b else None


# --- section: sampling -------------------------------------------------------------------------


def _sampling_section(ctx: _Context) -> dict[str, Any]:
    sizes = ctx.sizes
    counts = sorted(set(sizes.curve) | {sizes.sampling_targets})
    curve = []
    for count in counts:
        if count == sizes.sampling_targets:
            curve.append(_sampling_cost(ctx, count, sizes.sampling_seconds, windows=3))
        else:
            curve.append(_sampling_cost(ctx, count, sizes.curve_seconds, windows=1))
    main = next(p for p in curve if p["targets"] == sizes.sampling_targets)
    return {
        **main,
        "curve": curve,
        "per_target_ms": _slope(curve),
        "source_cpu_ms": _source_costs(ctx),
    }


def _source_costs(ctx: _Context) -> dict[str, float]:
    """CPU of one call of each per-target source, measured in this process.

    The probe's figure is the calling thread's only (its watchdog thread and the health
    endpoint, which runs here too, are left out): a lower bound of what a probe costs.
    """
    from exporter.config import Target
    from exporter.sources.disk import DiskSource
    from exporter.sources.probe import Prober
    from exporter.sources.process import ProcessSource

    tree = ctx.farm.targets[0]
    target = Target(
        name=tree.name,
        engine="vllm",
        base_url=ctx.health.url,
        health_path="/health",
        probe_timeout_seconds=0.8,
        pidfile=str(tree.pidfile),
    )
    prober = Prober(target)
    try:
        return {
            f"process tree of {len(tree.workers) + 1}": _cpu_per_call(ProcessSource(target).sample),
            "health probe": _cpu_per_call(prober.probe_health),
            "host disks": _cpu_per_call(DiskSource().sample),
        }
    finally:
        prober.close()


def _cpu_per_call(call: Callable[[], object], calls: int = 50) -> float:
    call()  # the first call sets up (finds the process, opens files)
    started = time.thread_time()
    for _ in range(calls):
        call()
    return round((time.thread_time() - started) * 1000 / calls, 3)


def _sampling_cost(ctx: _Context, targets: int, seconds: float, windows: int) -> dict[str, Any]:
    """CPU of the exporter and its NVML child while it ticks unscraped.

    The figure is the median of ``windows`` consecutive windows: other work on a shared box
    only ever adds to a window, and the median keeps one disturbed window out.
    """
    interval = ctx.sizes.interval
    with _farm_exporter(ctx, f"sampling-{targets}", targets) as exp:
        time.sleep(2 * interval)  # past the first ticks' one-off work (handles, classifiers)
        measured = [_cpu_window(exp, seconds / windows) for _ in range(windows)]
        tick = _metric_value(exp.get("/metrics"), "inference_exporter_tick_duration_seconds")
        if ctx.profile_dir is not None and targets == ctx.sizes.sampling_targets:
            ctx.profiles["sampling"] = _py_spy(exp, ctx.profile_dir / "sampling", seconds)
    cpu, child = (statistics.median(m[i] for m in measured) for i in (0, 1))
    return {
        "targets": targets,
        "processes": targets * (ctx.sizes.procs_per_target + 1),
        "gpus": ctx.sizes.gpus,
        "interval_s": interval,
        "windows_s": [round(seconds / windows, 1)] * windows,
        "cpu_per_tick_ms": round(cpu * 1000 * interval, 2),
        "cpu_per_tick_ms_windows": [round(m[0] * 1000 * interval, 2) for m in measured],
        "nvml_child_per_tick_ms": round(child * 1000 * interval, 2),
        "cpu_percent_of_core": round(cpu * 100, 2),
        "tick_wall_ms": None if tick is None else round(tick * 1000, 2),
    }


def _cpu_window(server: _Server, seconds: float) -> tuple[float, float]:
    """CPU seconds per second of the server with its children, and of the children alone."""
    cpu0, child0, t0 = server.cpu_seconds(), server.child_cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    cpu1, child1, t1 = server.cpu_seconds(), server.child_cpu_seconds(), time.monotonic()
    return (cpu1 - cpu0) / (t1 - t0), (child1 - child0) / (t1 - t0)


def _metric_value(exposition: bytes, name: str) -> float | None:
    for line in exposition.decode(errors="replace").splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return None


def _slope(curve: list[dict[str, Any]]) -> float | None:
    """Least-squares CPU milliseconds per added target."""
    xs = [float(p["targets"]) for p in curve]
    ys = [float(p["cpu_per_tick_ms"]) for p in curve]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return round(num / sum((x - mx) ** 2 for x in xs), 2)


# --- sections: ready and stall (real simulator processes) ---------------------------------------


@dataclass
class _Sim:
    """A running simulator and the files it writes."""

    popen: subprocess.Popen[bytes]
    log_file: Path
    gpu_state: Path
    launched_at: float
    _buffer: bytes = b""

    def ready_at(self, timeout: float) -> float:
        """Block until the ``SIMULATOR ready_at=`` line; return that time."""
        assert self.popen.stdout is not None  # stdout=PIPE
        deadline = time.monotonic() + timeout
        while b"SIMULATOR ready_at=" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self.popen.poll() is not None:
                raise BenchError("the simulator never printed its ready line")
            if _readable(self.popen.stdout.fileno(), min(left, 0.5)):
                self._buffer += os.read(self.popen.stdout.fileno(), 4096)
        line = self._buffer.split(b"SIMULATOR ready_at=", 1)[1].split(maxsplit=1)[0]
        return float(line)


@dataclass(frozen=True, slots=True)
class _SimFiles:
    port: int
    pidfile: Path
    log_file: Path
    gpu_state: Path
    weights: Path


def _sim_files(work: Path) -> _SimFiles:
    (work / "weights").mkdir(parents=True, exist_ok=True)
    port, weights = _free_port(), work / "weights"
    return _SimFiles(port, work / "engine.pid", work / "engine.log", work / "gpus.state", weights)


@contextlib.contextmanager
def _simulator(files: _SimFiles, scenario: str) -> Iterator[_Sim]:
    """A short simulated cold start (well under a second of engine time, plus imports)."""
    argv = [sys.executable, "-m", "exporter", "simulate", "--port", str(files.port)]
    argv += ["--scenario", scenario, "--weights-mb", "2", "--read-mbps", "40"]
    argv += ["--start-seconds", "0.3", "--init-seconds", "0.5", "--gpus", "1"]
    argv += ["--gpu-state-file", str(files.gpu_state), "--log-file", str(files.log_file)]
    argv += ["--pid-file", str(files.pidfile), "--work-dir", str(files.weights)]
    launched = time.time()
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    sim = _Sim(popen, files.log_file, files.gpu_state, launched)
    try:
        yield sim
    finally:
        _stop(popen)
        if popen.stdout is not None:
            popen.stdout.close()


def _sim_target_toml(files: _SimFiles, stall: float | None = None) -> str:
    text = (
        f'[[target]]\nname = "engine"\nengine = "sglang"\n'
        f'base_url = "http://127.0.0.1:{files.port}"\npidfile = "{files.pidfile}"\n'
        f'log_file = "{files.log_file}"\nmodel_path = "{files.weights}"\n'
    )
    if stall is not None:
        text += (
            f'[target.stall]\nstarting = "{max(stall, 10.0)}s"\nloading = "{stall}s"\n'
            f'initializing = "{stall}s"\n'
        )
    return text


def _engine(server: _Server) -> dict[str, Any]:
    doc = server.status()
    if not doc["targets"]:
        raise ValueError("no tick yet")
    target: dict[str, Any] = doc["targets"][0]
    target["taken_at"] = doc["taken_at"]
    return target


def _ready_section(ctx: _Context) -> dict[str, Any]:
    return {"runs": [_ready_lags(ctx, interval) for interval in ctx.sizes.ready_intervals]}


def _ready_lags(ctx: _Context, interval: float) -> dict[str, Any]:
    """Start the simulator ``starts`` times; the lag from its ready line to the exporter's."""
    files = _sim_files(ctx.next_dir(f"ready-{interval:g}-sim"))
    env = {"SIMULATED_NVML_STATE": str(files.gpu_state)}
    toml = _sim_target_toml(files)
    lags = []
    with _exporter(ctx, f"ready-{interval:g}", toml, interval=interval, env=env) as exp:
        for _ in range(ctx.sizes.starts):
            # An engine turns ready at any moment of the exporter's tick: start at a random one.
            time.sleep(random.uniform(0, interval))
            with _simulator(files, "healthy") as sim:
                ready_at = sim.ready_at(timeout=60)
                # "since" is the time of the tick that saw it ready: when /metrics says so.
                since = _wait_for(_flagged(exp, sim, "ready", "since"), 30, "ready")
                lags.append(since - ready_at)
            _wait_until(_engine_is(exp, "ready", False), 30, "the exporter to see the stop")
    return {
        "interval_s": interval,
        "starts": len(lags),
        "median_s": round(statistics.median(lags), 3),
        "max_s": round(max(lags), 3),
        "lags_s": [round(x, 3) for x in lags],
    }


def _flagged(server: _Server, sim: _Sim, flag: str, when: str) -> Callable[[], float | None]:
    """The ``when`` time of this simulator run's target, once the exporter raises ``flag``."""

    def at() -> float | None:
        with contextlib.suppress(OSError, ValueError):
            doc = _engine(server)
            this_run = (doc.get("started_at") or 0) >= sim.launched_at - 1
            if doc[flag] and this_run and doc[when] is not None:
                return float(doc[when])
        return None

    return at


def _engine_is(server: _Server, flag: str, value: bool) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(OSError, ValueError):
            return bool(_engine(server)[flag]) is value
        return False

    return check


def _stall_section(ctx: _Context) -> dict[str, Any]:
    return {"runs": [_stall_delays(ctx, interval) for interval in ctx.sizes.stall_intervals]}


def _stall_delays(ctx: _Context, interval: float) -> dict[str, Any]:
    """Hang the simulator ``stalls`` times; the delay from its last progress to the flag.

    The hang's moment is the simulator's last write: its log line and its GPU state are the
    last things that move (an unchanged GPU state is not rewritten).
    """
    threshold = ctx.sizes.stall_threshold
    files = _sim_files(ctx.next_dir(f"stall-{interval:g}-sim"))
    env = {"SIMULATED_NVML_STATE": str(files.gpu_state)}
    toml = _sim_target_toml(files, stall=threshold)
    delays = []
    with _exporter(ctx, f"stall-{interval:g}", toml, interval=interval, env=env) as exp:
        for _ in range(ctx.sizes.stalls):
            with _simulator(files, "hang-initializing") as sim:
                seen = _flagged(exp, sim, "stalled", "taken_at")
                taken_at = _wait_for(seen, threshold + 60, "a stall flag")
                hang_at = max(files.log_file.stat().st_mtime, files.gpu_state.stat().st_mtime)
                delays.append(taken_at - hang_at)
            _wait_until(_engine_is(exp, "stalled", False), 30, "the flag to clear")
    return {
        "interval_s": interval,
        "threshold_s": threshold,
        "limit_s": threshold + 2 * interval,
        "max_s": round(max(delays), 3),
        "delays_s": [round(x, 3) for x in delays],
    }


_SECTION_RUNNERS: Final[dict[str, Callable[[_Context], dict[str, Any]]]] = {
    "scrape": _scrape_section,
    "sampling": _sampling_section,
    "ready": _ready_section,
    "stall": _stall_section,
}


# --- goals and the table --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Goal:
    """One goal of the performance issue and how this run did against it."""

    name: str
    measured: float | None
    limit: float
    unit: str
    at_most: bool = True

    @property
    def met(self) -> bool | None:
        """Whether the measurement is within the limit; None when it was not measured."""
        if self.measured is None:
            return None
        return self.measured <= self.limit if self.at_most else self.measured >= self.limit


def evaluate_goals(report: dict[str, Any], sizes: Sizes) -> list[dict[str, Any]]:
    """The goals of the issue against this report's figures (those of skipped sections: None)."""
    goals = _scrape_goals(report.get("scrape")) + _sampling_goals(report.get("sampling"), sizes)
    goals += _detection_goals(report.get("ready"), report.get("stall"))
    return [asdict(g) | {"met": g.met} for g in goals]


def _scrape_goals(scrape: dict[str, Any] | None) -> list[Goal]:
    ours = (scrape or {}).get("exporter", {})
    seq, conc, mem = ours.get("sequential", {}), ours.get("concurrent", {}), ours.get("memory", {})
    return [
        Goal("scrape p99, sequential", seq.get("p99_ms"), 1.0, "ms"),
        Goal(
            "node_exporter p50 / ours (times faster)",
            (scrape or {}).get("node_over_exporter_p50"),
            5.0,
            "x",
            at_most=False,
        ),
        Goal("slowest scrape, concurrent scrapers", conc.get("max_ms"), 100.0, "ms"),
        Goal("RSS after the scrapes", mem.get("rss_max_mib"), 40.0, "MiB"),
        Goal("RSS growth over the scrapes", mem.get("rss_growth_after_warmup_mib"), 1.0, "MiB"),
    ]


def _sampling_goals(sampling: dict[str, Any] | None, sizes: Sizes) -> list[Goal]:
    measured = (sampling or {}).get("cpu_percent_of_core")
    name = f"sampling CPU, {sizes.sampling_targets} targets x {sizes.procs_per_target} processes"
    return [Goal(name, measured, 1.0, "% of a core")]


def _detection_goals(ready: dict[str, Any] | None, stall: dict[str, Any] | None) -> list[Goal]:
    goals = []
    for run in (ready or {}).get("runs", []):
        interval = run["interval_s"]
        goals.append(
            Goal(f"ready lag median, interval {interval:g}s", run["median_s"], interval, "s")
        )
        goals.append(Goal(f"ready lag max, interval {interval:g}s", run["max_s"], interval, "s"))
    for run in (stall or {}).get("runs", []):
        name = (
            f"stall flag after hang, threshold {run['threshold_s']:g}s + 2 x {run['interval_s']:g}s"
        )
        goals.append(Goal(name, run["max_s"], run["limit_s"], "s"))
    return goals


def render_table(report: dict[str, Any]) -> str:
    """The goals and the main figures as plain text tables."""
    host = report["host"]
    lines = [
        f"bench {host['date']}  {host['cpus']} CPUs ({host['cpu_model']})  load average before "
        f"{_loads(host['load_average_before'])}, after {_loads(host.get('load_average_after'))}",
        "",
        _row(("goal", "measured", "limit", "met", ""), _GOAL_COLUMNS),
    ]
    for g in report["goals"]:
        measured = "-" if g["measured"] is None else f"{g['measured']:g}"
        limit = ("<= " if g["at_most"] else ">= ") + f"{g['limit']:g}"
        met = {True: "yes", False: "NO", None: "-"}[g["met"]]
        lines.append(_row((g["name"], measured, limit, met, g["unit"]), _GOAL_COLUMNS))
    return "\n".join(
        lines + _scrape_lines(report) + _sampling_lines(report) + _detection_lines(report)
    )


_GOAL_COLUMNS: Final = (-58, 10, 10, 5, -12)
_SCRAPE_COLUMNS: Final = (-16, 8, 8, 8, 8, 9, 9, 8)
_SAMPLING_COLUMNS: Final = (-16, 7, 12, 12, 8, 13)


def _row(cells: Sequence[object], widths: Sequence[int]) -> str:
    """Cells padded to ``widths`` (negative: left-aligned)."""
    out = [
        f"{'-' if c is None else c!s:<{-w}}" if w < 0 else f"{'-' if c is None else c!s:>{w}}"
        for c, w in zip(cells, widths, strict=True)
    ]
    return " ".join(out).rstrip()


def _loads(values: list[float] | None) -> str:
    return "-" if not values else "/".join(f"{v:.2f}" for v in values)


def _scrape_lines(report: dict[str, Any]) -> list[str]:
    scrape = report.get("scrape")
    if not scrape:
        return []
    head = ("scrape", "p50 ms", "p99 ms", "max ms", "CPU ms", "8x per s", "8x max", "RSS MiB")
    lines = [
        "",
        f"scrapes with {scrape['targets']} targets and {scrape['gpus']} GPUs; "
        f"8x: {scrape['exporter']['concurrent']['scrapers']} concurrent scrapers",
        _row(head, _SCRAPE_COLUMNS),
    ]
    for name in ("exporter", "node_exporter"):
        figures = scrape[name]
        if "sequential" not in figures:
            lines.append(f"{name:<16} {figures.get('error', 'not measured')}")
            continue
        seq, conc = figures["sequential"], figures["concurrent"]
        cells = (name, seq["p50_ms"], seq["p99_ms"], seq["max_ms"], seq["cpu_per_scrape_ms"])
        lines.append(
            _row((*cells, conc["per_second"], conc["max_ms"], figures["rss_mib"]), _SCRAPE_COLUMNS)
        )
    memory = scrape["exporter"].get("memory")
    if memory:
        lines.append(
            f"exporter RSS MiB: {memory['rss_after_start_mib']} after start, "
            f"{memory['rss_after_scrapes_mib']} after {memory['scrapes']} scrapes "
            f"(max {memory['rss_max_mib']}); its NVML child {memory['nvml_child_rss_mib']}"
        )
    return lines


def _sampling_lines(report: dict[str, Any]) -> list[str]:
    sampling = report.get("sampling")
    if not sampling:
        return []
    head = ("targets", "procs", "CPU ms/tick", "NVML child", "% core", "tick wall ms")
    lines = [
        "",
        f"sampling at a {sampling['interval_s']:g} s interval, {sampling['gpus']} GPUs, "
        "CPU of the exporter and its NVML child",
        _row(head, _SAMPLING_COLUMNS),
    ]
    for p in sampling["curve"]:
        cells = (p["targets"], p["processes"], p["cpu_per_tick_ms"], p["nvml_child_per_tick_ms"])
        lines.append(_row((*cells, p["cpu_percent_of_core"], p["tick_wall_ms"]), _SAMPLING_COLUMNS))
    costs = ", ".join(f"{k} {v}" for k, v in sampling.get("source_cpu_ms", {}).items())
    lines.append(f"per call, CPU ms (bench process): {costs}")
    return lines


def _detection_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for key, what, values in (
        ("ready", "ready lags", "lags_s"),
        ("stall", "stall delays", "delays_s"),
    ):
        for run in (report.get(key) or {}).get("runs", []):
            lines.append(f"{what} at a {run['interval_s']:g} s interval, s: {run[values]}")
    return ["", *lines] if lines else []


# --- /proc and small waits -------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's), from /proc/PID/task/*/children."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(w) for w in f.read().split())
    return found


def _cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid``, reaped children included (/proc/PID/stat), seconds."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(_POLL)
    raise BenchError(f"timed out after {timeout:g}s waiting for {what}")


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    _wait_for(lambda: True if condition() else None, timeout, what)


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))
