"""Sections ``ready`` and ``stall``: how soon the exporter sees a real simulator turn ready or hang.

Each run starts the simulator (through the one launcher) under an exporter already watching its
port, and times the exporter's verdict against the simulator's own account of the moment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import select
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from exporter.render.status_doc import TargetDoc
from exporter_tooling.bench.context import BenchContext
from exporter_tooling.bench.records import ReadyRun, ReadySection, StallRun, StallSection
from exporter_tooling.bench.servers import Server, exporter
from exporter_tooling.bench.waiting import BenchError, wait_for, wait_until
from exporter_tooling.fakenvml import STATE_ENV
from exporter_tooling.processes import free_port, stop_process
from exporter_tooling.simulate.launcher import (
    READY_PREFIX,
    SimulatorFiles,
    SimulatorSpec,
    ready_time,
    simulator_argv,
)

#: A short simulated cold start: well under a second of engine time, plus imports.
_SHORT_START: Final = SimulatorSpec(
    port=0, weights_mb=2, read_mbps=40.0, start_seconds=0.3, init_seconds=0.5, gpus=1
)
Flag = Literal["ready", "stalled"]
When = Literal["since", "taken_at"]


@dataclass
class _Sim:
    """A running simulator and when it was launched."""

    popen: subprocess.Popen[bytes]
    launched_at: float
    _buffer: bytes = b""

    def ready_at(self, timeout: float) -> float:
        """Block until the simulator's ready line; return the time it gives."""
        assert self.popen.stdout is not None  # stdout=PIPE
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while READY_PREFIX.encode() not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self.popen.poll() is not None:
                raise BenchError("the simulator never printed its ready line")
            if select.select([fd], [], [], min(left, 0.5))[0]:
                self._buffer += os.read(fd, 4096)
        line = self._buffer[self._buffer.index(READY_PREFIX.encode()) :].decode(errors="replace")
        ready = ready_time(line)
        assert ready is not None  # the line starts with the prefix
        return ready


@contextlib.contextmanager
def _simulator(files: SimulatorFiles, port: int, scenario: str) -> Iterator[_Sim]:
    spec = dataclasses.replace(_SHORT_START, port=port, scenario=scenario)
    launched = time.time()
    popen = subprocess.Popen(
        simulator_argv(spec, files), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        yield _Sim(popen, launched)
    finally:
        stop_process(popen)
        if popen.stdout is not None:
            popen.stdout.close()


def _sim_target_toml(files: SimulatorFiles, port: int, stall: float | None = None) -> str:
    text = (
        f'[[target]]\nname = "engine"\nengine = "sglang"\n'
        f'base_url = "http://127.0.0.1:{port}"\npidfile = "{files.pid_file}"\n'
        f'log_file = "{files.log_file}"\nmodel_path = "{files.weights}"\n'
    )
    if stall is not None:
        text += (
            f'[target.stall]\nstarting = "{max(stall, 10.0)}s"\nloading = "{stall}s"\n'
            f'initializing = "{stall}s"\n'
        )
    return text


def _engine(server: Server) -> tuple[TargetDoc, float]:
    """The one target's /status document, and when the document was taken."""
    doc = server.status()
    if not doc["targets"]:
        raise ValueError("no tick yet")
    return doc["targets"][0], doc.get("taken_at", 0.0)


def ready_section(ctx: BenchContext) -> ReadySection:
    """Ready lags at every ``sizes.ready_intervals``."""
    return {"runs": [_ready_lags(ctx, interval) for interval in ctx.sizes.ready_intervals]}


def _ready_lags(ctx: BenchContext, interval: float) -> ReadyRun:
    """Start the simulator ``starts`` times; the lag from its ready line to the exporter's."""
    files = SimulatorFiles(ctx.next_dir(f"ready-{interval:g}-sim")).create()
    port = free_port()
    env = {STATE_ENV: str(files.gpu_state)}
    lags = []
    with exporter(
        ctx, f"ready-{interval:g}", _sim_target_toml(files, port), interval=interval, env=env
    ) as exp:
        for _ in range(ctx.sizes.starts):
            # An engine turns ready at any moment of the exporter's tick: start at a random one.
            time.sleep(random.uniform(0, interval))
            with _simulator(files, port, "healthy") as sim:
                ready_at = sim.ready_at(timeout=60)
                # "since" is the time of the tick that saw it ready: when /metrics says so.
                since = wait_for(_flagged(exp, sim, "ready", "since"), 30, "ready")
                lags.append(since - ready_at)
            wait_until(_engine_is(exp, "ready", False), 30, "the exporter to see the stop")
    return {
        "interval_s": interval,
        "starts": len(lags),
        "median_s": round(statistics.median(lags), 3),
        "max_s": round(max(lags), 3),
        "lags_s": [round(x, 3) for x in lags],
    }


def _flagged(server: Server, sim: _Sim, flag: Flag, when: When) -> Callable[[], float | None]:
    """The ``when`` time of this simulator run's target, once the exporter raises ``flag``."""

    def at() -> float | None:
        with contextlib.suppress(OSError, ValueError):
            target, taken_at = _engine(server)
            this_run = (target["started_at"] or 0) >= sim.launched_at - 1
            moment = target["since"] if when == "since" else taken_at
            if target[flag] and this_run and moment is not None:
                return float(moment)
        return None

    return at


def _engine_is(server: Server, flag: Flag, value: bool) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(OSError, ValueError):
            return _engine(server)[0][flag] is value
        return False

    return check


def stall_section(ctx: BenchContext) -> StallSection:
    """Stall delays at every ``sizes.stall_intervals``."""
    return {"runs": [_stall_delays(ctx, interval) for interval in ctx.sizes.stall_intervals]}


def _stall_delays(ctx: BenchContext, interval: float) -> StallRun:
    """Hang the simulator ``stalls`` times; the delay from its last progress to the flag.

    The hang's moment is the simulator's last write: its log line and its GPU state are the
    last things that move (an unchanged GPU state is not rewritten).
    """
    threshold = ctx.sizes.stall_threshold
    files = SimulatorFiles(ctx.next_dir(f"stall-{interval:g}-sim")).create()
    port = free_port()
    env = {STATE_ENV: str(files.gpu_state)}
    toml = _sim_target_toml(files, port, stall=threshold)
    delays = []
    with exporter(ctx, f"stall-{interval:g}", toml, interval=interval, env=env) as exp:
        for _ in range(ctx.sizes.stalls):
            with _simulator(files, port, "hang-initializing") as sim:
                seen = _flagged(exp, sim, "stalled", "taken_at")
                taken_at = wait_for(seen, threshold + 60, "a stall flag")
                hang_at = max(files.log_file.stat().st_mtime, files.gpu_state.stat().st_mtime)
                delays.append(taken_at - hang_at)
            wait_until(_engine_is(exp, "stalled", False), 30, "the flag to clear")
    return {
        "interval_s": interval,
        "threshold_s": threshold,
        "limit_s": threshold + 2 * interval,
        "max_s": round(max(delays), 3),
        "delays_s": [round(x, 3) for x in delays],
    }
