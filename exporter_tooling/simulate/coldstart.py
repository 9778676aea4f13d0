"""The simulated engine's main process: plays the phase schedule, runs workers, serves HTTP.

Owns the processes, files and timing of one simulated cold start; what the engine says lives in
``script``, the scenario knobs in ``plan``, the replies in ``server``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import tempfile
import threading
import time
from dataclasses import replace
from http import HTTPStatus
from pathlib import Path
from typing import Final, TextIO

from exporter_tooling.simulate.gpustate import (
    GIB,
    GpuLoad,
    GpuStatePublisher,
    used_bytes,
)
from exporter_tooling.simulate.numbers import log_numbers
from exporter_tooling.simulate.plan import MIB, Segment, SimConfig, WorkerPlan, weight_layout
from exporter_tooling.simulate.script import (
    BARRIER,
    SCRIPTS,
    Effect,
    Say,
    Step,
    render,
    shard_bar,
)
from exporter_tooling.simulate.server import Health, SimServer, health_paths
from exporter_tooling.simulate.workers import Worker

log = logging.getLogger(__name__)

TICK: Final = 0.1
#: During initializing the CPU is busy in bursts (compiling), BURST of every PERIOD seconds.
BURST_PERIOD: Final = 1.0
BURST: Final = 0.2
MODEL_NAME: Final = "simulated-model"
_DOTS_PER_SHARD: Final = 10
#: A wake brings the weights back in this many steps of this long (GPU memory climbing).
WAKE_STEPS: Final = 4
WAKE_STEP_SECONDS: Final = 0.4
#: The compile scenario compiles this many ``--init-seconds`` before the usual steps.
COMPILE_FACTOR: Final = 2.0
#: The rendezvous scenario waits for the other ranks this many ``--start-seconds``.
RENDEZVOUS_FACTOR: Final = 4.0


class SimulatorError(Exception):
    """A setup problem (port taken, file not writable); the message is one line for the user."""


class _Stopped(Exception):
    """SIGTERM or SIGINT: shut down and exit 0."""


class _Failed(Exception):
    """The simulated start failed (crash, OOM, worker gone); its lines are already out."""


class LogWriter:
    """Writes engine log lines from any thread, flushed as they are written.

    Args:
        stream: the log file or stderr.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._partial = False

    def lines(self, lines: list[str]) -> None:
        """Write whole lines, ending a pending partial line first."""
        with self._lock:
            text = ("\n" if self._partial else "") + "".join(f"{line}\n" for line in lines)
            self._partial = False
            self._write(text)

    def partial(self, text: str) -> None:
        """Write text without a newline (llama.cpp's progress dots)."""
        with self._lock:
            self._partial = True
            self._write(text)

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass  # the reader went away; the simulated engine keeps going, as a real one would


class ColdStart:
    """One simulated engine from launch to exit.

    Args:
        cfg: the validated flags.
        log_stream: where engine log lines go.
        out: where the one ``SIMULATOR ready_at=...`` line goes.
    """

    def __init__(self, cfg: SimConfig, log_stream: TextIO, out: TextIO) -> None:
        self.cfg = cfg
        self.script = SCRIPTS[cfg.engine]
        self._log = LogWriter(log_stream)
        self._out = out
        self._stop = threading.Event()
        self._workers: list[Worker] = []
        self._created: list[Path] = []
        self._dir = Path()
        self._own_dir = False
        self._segments: list[Segment] = []
        self._ctx: dict[str, object] = {}
        self._gpu = GpuLoad()
        self._serving = False
        self._listening = False
        self._last_completion = -math.inf
        self._load_seconds = 0.0
        self._origin = time.monotonic()
        self._server = SimServer(cfg.engine, cfg.host, cfg.port, MODEL_NAME, self._on_request)
        self._publisher: GpuStatePublisher | None = None

    def stop(self) -> None:
        """Ask for a prompt, clean exit (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        """Play the whole cold start; returns the exit code (0 stopped, 1 failed).

        Raises:
            SimulatorError: a setup problem, before or while the weights are created.
        """
        try:
            self._prepare()
            self._start()
            self._load()
            self._initialize()
            self._announce(self._become_ready())
            self._serve()
        except _Stopped:
            return 0
        except _Failed:
            return 1
        finally:
            self._shut_down()
        return 0

    # --- phases -----------------------------------------------------------------------

    def _prepare(self) -> None:
        cfg = self.cfg
        if cfg.pid_file is not None:
            _write_or_explain(cfg.pid_file, f"{os.getpid()}\n", "--pid-file")
        _check_port(cfg.host, cfg.port)
        self._dir = self._make_dir()
        self._segments = weight_layout(cfg.engine, self._dir, cfg.weights_bytes)
        self._ctx = log_numbers(cfg, self._dir, self._segments[0].path, os.getpid())
        if cfg.gpu_state_file is not None:
            self._publisher = GpuStatePublisher(
                cfg.gpu_state_file, cfg.gpus, cfg.weights_bytes, self._gpu_now, cfg.gpu_name
            )
            try:
                self._publisher.start()
            except OSError as exc:
                self._publisher = None
                raise SimulatorError(
                    f"--gpu-state-file: cannot write {cfg.gpu_state_file}: {exc.strerror}"
                ) from exc

    def _start(self) -> None:
        started = time.monotonic()
        if self.cfg.plan.download:
            self._download_weights()
            started = time.monotonic()
        else:
            self._create_weights()
        self._play(self.script.starting, self.cfg.start_seconds, origin=started)
        if self.cfg.plan.rendezvous:
            self._wait_for_peers()
        self._spawn()

    def _load(self) -> None:
        self._say(self.script.load_begin)
        started = time.monotonic()
        for worker in self._workers:
            worker.start_loading()
        shards = len(self._segments)
        self._mark_shards(0, started)
        shown, moved_at, last = 0, started, 0
        while shown < shards:
            # Poll slowly once reading has started and stopped, so a hung load is as idle as a
            # real one; workers still importing (no bytes yet) are polled at full speed.
            step = 1.0 if last and time.monotonic() - moved_at > 1.0 else TICK
            self._sleep_until(time.monotonic() + step, tick=step)
            read = sum(w.bytes_read for w in self._workers)
            if read != last:
                moved_at, last = time.monotonic(), read
            fraction = read / self.cfg.weights_bytes
            self._gpu = replace(self._gpu, weights_fraction=fraction)
            xid_at = self.cfg.plan.xid_load_at
            if xid_at is not None and fraction >= xid_at and self._gpu.xid is None:
                self._gpu = replace(self._gpu, xid=79)  # GPU 0 fell off the bus
            crash_at = self.cfg.plan.crash_load_at
            if crash_at is not None and fraction >= crash_at:
                self._fail(self.script.crash)
            while shown < min(w.segments_done for w in self._workers):
                shown += 1
                self._mark_shards(shown, started)
        took = time.monotonic() - started
        final = shard_bar(self.script.shard_bar, shards, shards, took)
        self._ctx.update(load_s=took, load_total_s=took + 0.2, final_bar=final)
        self._load_seconds = took
        self._say(self.script.load_end)

    def _initialize(self) -> None:
        """KV cache, compile, CUDA graphs; a GPU warm-up scenario keeps the GPUs busy instead."""
        if self.cfg.plan.gpu_warmup:
            self._gpu = replace(self._gpu, util=95, mem_util=40)
        if self.cfg.plan.compile:  # compiling, the GPU flat: a compile cache miss
            self._sleep_until(time.monotonic() + COMPILE_FACTOR * self.cfg.init_seconds, True)
        busy = not self.cfg.plan.gpu_warmup
        self._play(self.script.initializing, self.cfg.init_duration, busy=busy)

    def _wait_for_peers(self) -> None:
        """Wait for the other ranks, quiet but for torch's store-based barrier line."""
        says = (BARRIER,)
        until = time.monotonic() + RENDEZVOUS_FACTOR * self.cfg.start_seconds
        while time.monotonic() < until:
            self._say(says)
            self._sleep_until(min(until, time.monotonic() + 1.0), tick=1.0)

    def _become_ready(self) -> float:
        """Listen (if not yet), warm up, turn healthy; returns the wall time health turned 200."""
        warmup = self.script.warmup_seconds
        ready_at = time.time()
        if not self._listening:
            self._say(self.script.listen)
            self._server.health = Health.WARMING if warmup else Health.READY
            ready_at = time.time()
            self._listen()
        if warmup:
            self._gpu = replace(self._gpu, util=95, mem_util=40)
            self._sleep_until(time.monotonic() + warmup)
            ready_at = time.time()
        self._server.health = Health.READY
        self._server.startup = {
            "load": self._load_seconds,
            "total": time.monotonic() - self._origin,
        }
        self._say(self.script.ready)
        return ready_at

    def _announce(self, ready_at: float) -> None:
        self._serving = True
        self._gpu = replace(self._gpu, util=0, mem_util=0)
        log.info("simulate_ready engine=%s ready_at=%.3f", self.cfg.engine, ready_at)
        try:
            self._out.write(f"SIMULATOR ready_at={ready_at:.6f} pid={os.getpid()}\n")
            self._out.flush()
        except (OSError, ValueError):
            pass

    def _serve(self) -> None:
        if self.cfg.plan.sleep_wake:
            self._sleep_and_wake()
        if not self.cfg.plan.flap:
            self._sleep_until(math.inf, tick=0.5)
            return
        while True:
            self._sleep_until(time.monotonic() + self.cfg.flap_seconds)
            self._server.health = Health.FAILING
            self._sleep_until(time.monotonic() + self.cfg.flap_seconds)
            self._server.health = Health.READY

    def _sleep_and_wake(self) -> None:
        """Sleep mode as vLLM does it, forever: weights offloaded and KV cache dropped, then back.

        Asleep, ``/health`` still answers 200, ``/is_sleeping`` says true and completions
        answer 503. Waking, GPU memory climbs back over about a second before the engine
        says it is awake, as the weights come back from CPU memory.
        """
        stretch = self.cfg.flap_seconds
        awake = self._gpu
        while True:
            self._sleep_until(time.monotonic() + stretch)
            freed = used_bytes(awake, self.cfg.weights_bytes) / GIB
            self._gpu = replace(awake, weights_fraction=0.0, kv_cache=False, util=0)
            self._server.health = Health.SLEEPING
            self._say_with(self.script.fall_asleep, freed_gib=freed, sleep_s=0.35)
            self._sleep_until(time.monotonic() + stretch)
            woke = time.monotonic()
            for step in range(1, WAKE_STEPS + 1):
                self._gpu = replace(self._gpu, weights_fraction=step / WAKE_STEPS)
                self._sleep_until(time.monotonic() + WAKE_STEP_SECONDS)
            self._gpu = awake
            self._server.health = Health.READY
            self._say_with(self.script.wake_up, wake_s=time.monotonic() - woke)

    def _say_with(self, says: tuple[Say, ...], **numbers: float) -> None:
        saved = self._ctx
        self._ctx = {**saved, **numbers}
        try:
            self._say(says)
        finally:
            self._ctx = saved

    # --- steps and effects ------------------------------------------------------------

    def _play(
        self,
        steps: tuple[Step, ...],
        duration: float,
        busy: bool = False,
        origin: float | None = None,
    ) -> None:
        """Say each step at its fraction of ``duration`` from ``origin`` (default: now)."""
        started = time.monotonic() if origin is None else origin
        for step in steps:
            self._sleep_until(started + step.at * duration, busy)
            self._apply(step.effect)
            if not (self.cfg.plan.quiet and 0 < step.at < 1):
                self._say(step.says)
            if step.effect is Effect.KV_CACHE and self.cfg.plan.hang_init:
                # Weights and KV cache are in; it hangs the way an NCCL collective does: GPU
                # pinned at 100 %, nothing else moving (DESIGN.md: utilisation is no progress).
                self._hang(util=100)
        self._sleep_until(started + duration, busy)

    def _apply(self, effect: Effect | None) -> None:
        if effect is Effect.BIND:
            self._bind()
        elif effect is Effect.LISTEN:
            self._listen()
        elif effect is Effect.SPAWN:
            self._spawn()
        elif effect is Effect.KV_CACHE:
            self._gpu = replace(self._gpu, kv_cache=True)
        elif effect is Effect.GRAPHS:
            if self.cfg.plan.oom_init:
                self._fail(self.script.oom)
            util = 5 if self.cfg.plan.compile else 60  # a compile-bound start: captured fast
            self._gpu = replace(self._gpu, graphs=True, util=util, mem_util=25)
        elif effect is Effect.WARMUP:
            self._gpu = replace(self._gpu, util=95, mem_util=40)

    def _mark_shards(self, done: int, started: float) -> None:
        shards = len(self._segments)
        if self.cfg.plan.quiet and 0 < done < shards:
            return
        if not self.script.shard_bar:
            if done > 0:
                self._log.partial("." * _DOTS_PER_SHARD)
            return
        elapsed = time.monotonic() - started
        self._log.lines([shard_bar(self.script.shard_bar, done, shards, elapsed)])

    def _hang(self, util: int = 0) -> None:
        self._gpu = replace(self._gpu, util=util, mem_util=0)
        self._sleep_until(math.inf, tick=1.0)

    def _fail(self, says: tuple[Say, ...]) -> None:
        self._say(says)
        log.info("simulate_failed engine=%s scenario=%s", self.cfg.engine, self.cfg.scenario)
        raise _Failed

    def _say(self, says: tuple[Say, ...]) -> None:
        now = time.time()
        lines = [
            ln for say in says for ln in render(self.cfg.engine, say, self._ctx, now, self.cfg.gpus)
        ]
        if lines:
            self._log.lines(lines)

    # --- time -------------------------------------------------------------------------

    def _sleep_until(self, deadline: float, busy: bool = False, tick: float = TICK) -> None:
        """Wait until ``deadline`` (monotonic), burning CPU in bursts when ``busy``.

        Raises:
            _Stopped: a stop was asked for.
            _Failed: a worker process died.
        """
        while True:
            self._check()
            now = time.monotonic()
            if now >= deadline:
                return
            if busy and self._burn(deadline):
                continue
            self._stop.wait(min(tick, deadline - now))

    def _burn(self, deadline: float) -> bool:
        now = time.monotonic()
        burst = BURST_PERIOD if self.cfg.plan.compile else BURST
        into = (now - self._origin) % BURST_PERIOD
        if into >= burst:
            return False
        end = min(deadline, now + burst - into)
        while time.monotonic() < end and not self._stop.is_set():
            pass
        return True

    def _check(self) -> None:
        if self._stop.is_set():
            raise _Stopped
        dead = [w for w in self._workers if not w.alive()]
        if dead:
            # A signal to the whole process group reaches the workers too; let ours land first.
            if self._stop.wait(0.2):
                raise _Stopped
            log.warning("simulate_worker_died pid=%d", dead[0].pid)
            self._fail(self.script.worker_died)

    # --- resources --------------------------------------------------------------------

    def _make_dir(self) -> Path:
        if self.cfg.work_dir is None:
            self._own_dir = True
            return Path(tempfile.mkdtemp(prefix="ile-simulate-"))
        try:
            self.cfg.work_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SimulatorError(
                f"--work-dir: cannot create {self.cfg.work_dir}: {exc.strerror}"
            ) from exc
        return self.cfg.work_dir

    def _weight_sizes(self) -> dict[Path, int]:
        sizes: dict[Path, int] = {}
        for seg in self._segments:
            sizes[seg.path] = max(sizes.get(seg.path, 0), seg.offset + seg.length)
        return sizes

    def _download_weights(self) -> None:
        """The weights arrive over the network first, as huggingface_hub writes them.

        Each file is written as ``<name>.incomplete`` at ``--read-mbps`` and renamed when
        complete; ``hang-downloading`` stops halfway with the file held open, as a download
        whose connection went silent does.
        """
        block = os.urandom(MIB)
        total, done = self.cfg.weights_bytes, 0
        hang_at = self.cfg.plan.hang_download_at
        for path, size in self._weight_sizes().items():
            partial = path.with_name(path.name + ".incomplete")
            self._created.append(partial)
            with partial.open("wb") as f:
                for _ in range(0, size, MIB):
                    if hang_at is not None and done >= hang_at * total:
                        self._hang()
                    n = min(MIB, size - f.tell())
                    f.write(block[:n])
                    f.flush()
                    done += n
                    self._sleep_until(time.monotonic() + n / (self.cfg.read_mbps * MIB))
                os.fsync(f.fileno())
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            partial.rename(path)
            self._created.append(path)

    def _create_weights(self) -> None:
        block = os.urandom(MIB)  # incompressible: no file system can shrink the reads
        for path, size in self._weight_sizes().items():
            self._created.append(path)
            try:
                _write_weights(path, size, block, self._stop, keep=self.cfg.plan.warm_cache)
            except OSError as exc:
                raise SimulatorError(f"--work-dir: cannot write {path}: {exc.strerror}") from exc

    def _spawn(self) -> None:
        if self._workers:
            return
        cfg = self.cfg
        hang = cfg.plan.hang_load_at
        for rank in range(cfg.gpus):
            plan = WorkerPlan(
                rank=rank,
                world=cfg.gpus,
                parent=os.getpid(),
                segments=tuple(self._segments),
                bytes_per_second=cfg.read_bytes_per_second / cfg.gpus,
                stop_after=None if hang is None else int(cfg.weights_bytes * hang / cfg.gpus),
                cleanup=tuple(self._created) if rank == 0 else (),
                cleanup_dir=self._dir if rank == 0 and self._own_dir else None,
                linger_seconds=4 * cfg.flap_seconds if cfg.plan.orphan_workers else 0.0,
                gpu_state=cfg.gpu_state_file if rank == 0 else None,
                warm=cfg.plan.warm_cache,
            )
            self._workers.append(Worker(plan))

    def _bind(self) -> None:
        try:
            self._server.bind()
        except OSError as exc:
            raise SimulatorError(_bind_error_text(self.cfg.host, self.cfg.port, exc)) from exc

    def _listen(self) -> None:
        try:
            self._server.listen()
        except OSError as exc:
            raise SimulatorError(_bind_error_text(self.cfg.host, self.cfg.port, exc)) from exc
        self._listening = True

    def _shut_down(self) -> None:
        self._server.close()
        if self.cfg.plan.orphan_workers and self._workers:
            # Crashed: the workers live on with their GPU memory and clean up themselves.
            return
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            worker.reap()
        if self._publisher is not None:
            with contextlib.suppress(OSError):
                self._publisher.close()
        for path in self._created:
            path.unlink(missing_ok=True)
        if self._own_dir:
            with contextlib.suppress(OSError):
                self._dir.rmdir()

    # --- callbacks from other threads -------------------------------------------------

    def _gpu_now(self) -> tuple[GpuLoad, list[int]]:
        load = self._gpu
        busy = time.monotonic() - self._last_completion < 1.0
        if self._serving and self._server.health is Health.READY and busy:
            load = replace(load, util=85, mem_util=35)
        return load, [w.pid for w in self._workers]

    def _on_request(self, method: str, path: str, client: str, status: int) -> None:
        if path == "/v1/completions" and status == 200:
            self._last_completion = time.monotonic()
        access = self.script.access
        if access is None or (
            path in health_paths(self.cfg.engine) and not self.script.access_health
        ):
            return
        ctx = {
            "method": method,
            "path": path,
            "client": client,
            "client_ip": client.rsplit(":", 1)[0],
            "status": status,
            "reason": HTTPStatus(status).phrase,
        }
        self._log.lines(render(self.cfg.engine, access, ctx, time.time(), 1))


def _write_weights(
    path: Path, size: int, block: bytes, stop: threading.Event, *, keep: bool = False
) -> None:
    """Write one weight file; its pages are dropped from the cache unless ``keep``."""
    with path.open("wb") as f:
        left = size
        while left > 0:
            if stop.is_set():
                raise _Stopped
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
        if not keep:
            # Clean pages can be dropped: the first read then comes from the disk even
            # without O_DIRECT.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _write_or_explain(path: Path, text: str, flag: str) -> None:
    try:
        path.write_text(text, encoding="ascii")
    except OSError as exc:
        raise SimulatorError(f"{flag}: cannot write {path}: {exc.strerror}") from exc


def _check_port(host: str, port: int) -> None:
    """Fail at launch, not at ready, when the port is taken (SGLang checks it up front too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SimulatorError(_bind_error_text(host, port, exc)) from exc


def _bind_error_text(host: str, port: int, exc: OSError) -> str:
    return f"--port: cannot bind {host}:{port}: {exc.strerror or exc}"
