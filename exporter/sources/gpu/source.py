"""GPU source: NVML sampled in a supervised child (``nvidia.worker``) with deadline and backoff.

Never calls NVML in-process: a segfault or a call stuck in the driver must not take the daemon
down. Each process record says whether its pid is visible in our PID namespace, so the join of
GPU memory to targets (``exporter.core.observe.attribute_gpu_memory``) needs no I/O.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final, NoReturn, cast

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import GpuProcess, GpuReading, GpuSample, MigSample
from exporter.sources.gpu.protocol import (
    REQUEST,
    Hello,
    MigProcessRecord,
    ProcessRecord,
    Reply,
    decode_object,
)
from exporter.sources.gpu.records import (
    HealthTracker,
    ValueCheck,
    optional_int,
    with_health,
    with_mig_mode,
)

log = logging.getLogger(__name__)

_PID_MAX_LIMIT: Final = 4_194_304  # the kernel's ceiling, when pid_max cannot be read


class NvmlReason(enum.StrEnum):
    """Why the NVML source is down; the values are the ``SourceError`` reasons."""

    LIBRARY_NOT_FOUND = "library_not_found"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    VERSION_MISMATCH = "version_mismatch"
    NO_PERMISSION = "no_permission"
    BINDING_MISSING = "binding_missing"
    INIT_FAILED = "init_failed"
    NVML_ERROR = "nvml_error"
    STARTING = "starting"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    SPAWN_FAILED = "spawn_failed"
    PROTOCOL = "protocol"


# NVML return codes (nvml.h) that say why NVML cannot be used at all.
_CODE_REASONS: Final[dict[int, NvmlReason]] = {
    4: NvmlReason.NO_PERMISSION,
    9: NvmlReason.DRIVER_NOT_LOADED,
    12: NvmlReason.LIBRARY_NOT_FOUND,
    18: NvmlReason.VERSION_MISMATCH,
}

#: Reasons that mean "this vendor's library is not on this host": the source is absent, not
#: down, until it has worked once.
ABSENT_REASONS: Final = frozenset({NvmlReason.LIBRARY_NOT_FOUND, NvmlReason.BINDING_MISSING})

_HINTS: Final[dict[NvmlReason, str]] = {
    NvmlReason.LIBRARY_NOT_FOUND: "no libnvidia-ml.so.1 on the loader path: on a host without "
    "NVIDIA GPUs set nvml = false in [exporter]; otherwise install the NVIDIA driver or point "
    "nvml_library_dir at it",
    NvmlReason.DRIVER_NOT_LOADED: "the nvidia kernel module is not loaded: check lsmod and dmesg",
    NvmlReason.VERSION_MISMATCH: "driver library and kernel module differ (driver upgraded "
    "without a reboot): reboot or reload the nvidia modules",
    NvmlReason.NO_PERMISSION: "cannot open /dev/nvidia*: check device permissions or the "
    "unit's DeviceAllow=",
    NvmlReason.BINDING_MISSING: "the pynvml module is missing: install nvidia-ml-py, or set "
    "nvml = false in [exporter]",
    NvmlReason.TIMEOUT: "an NVML call hung (driver stuck?): the child is killed and restarted",
    NvmlReason.CRASHED: "the NVML child died (NVML segfault?): it is restarted with backoff",
}


class _WorkerGone(Exception):
    """The child closed its pipe: it exited or was killed."""


class _Worker:
    """One NVML child process and the reply bytes read from it but not yet consumed."""

    def __init__(self, argv: list[str], env: Mapping[str, str], started: float) -> None:
        self.started = started
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True
        )
        self._buffer = bytearray()
        self._poll = select.poll()
        self._poll.register(self._stdout_fd(), select.POLLIN)

    def _stdout_fd(self) -> int:
        assert self.process.stdout is not None  # Popen with stdout=PIPE
        return self.process.stdout.fileno()

    def send(self, message: bytes) -> None:
        """Write one request; a dead child raises ``_WorkerGone``."""
        assert self.process.stdin is not None  # Popen with stdin=PIPE
        try:
            os.write(self.process.stdin.fileno(), message)
        except (BrokenPipeError, ValueError) as exc:
            raise _WorkerGone from exc

    def read_line(self, deadline: float, clock: Callable[[], float]) -> bytes | None:
        """The next reply line, or None when ``deadline`` passes first."""
        while b"\n" not in self._buffer:
            left = deadline - clock()
            if left <= 0:
                return None
            if not self._poll.poll(max(1, int(left * 1000))):
                continue
            chunk = os.read(self._stdout_fd(), 1 << 16)
            if not chunk:
                raise _WorkerGone
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line

    def kill(self) -> None:
        """SIGKILL: a child stuck in NVML ignores anything gentler."""
        self.process.kill()

    def reap(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the exit; close the pipes once it is gone."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        return True

    def exit_detail(self) -> str:
        """How the child ended, for a log line (it may still be exiting)."""
        code = self.process.poll()
        return "exit=unknown" if code is None else f"exit={code}"


def _with_visibility(
    processes: tuple[GpuProcess, ...], proc_root: str = "/proc"
) -> tuple[GpuProcess, ...]:
    """Each process marked visible or not in our PID namespace (a pid we have in /proc)."""
    return tuple(replace(p, visible=os.path.exists(f"{proc_root}/{p.pid}")) for p in processes)


def _read_pid_max(path: str = "/proc/sys/kernel/pid_max") -> int:
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return _PID_MAX_LIMIT


def _child_env(library_dir: str | None, extra: Mapping[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra}
    package_root = str(Path(__file__).resolve().parents[2])
    for name, first in (("LD_LIBRARY_PATH", library_dir), ("PYTHONPATH", package_root)):
        if first is not None:
            env[name] = f"{first}:{env[name]}" if env.get(name) else first
    return env


class GpuSource:
    """Samples every GPU through NVML in a child process that is restarted when it fails.

    ``sample()`` returns within ``call_timeout`` whatever NVML does. A hung or dead child is
    killed and restarted after an exponential backoff; init errors are classified, logged once
    with a hint and retried the same way, so NVML recovers without an exporter restart.

    Attributes:
        rejected_process_records: process records dropped as implausible (cumulative).
        rejected_values: GPU and MIG readings out of range, read as unknown (cumulative).
        child_starts: NVML children started so far.
        last_reading: the last good reading; marked ``stale`` once a later sample failed.
    """

    name: str = "nvml"
    #: The child's module, and how its init codes and failures read: a vendor's subclass
    #: (``amd.source.AmdGpuSource``) sets its own.
    worker_module: str = "exporter.sources.gpu.nvidia.worker"
    code_reasons: Mapping[int, NvmlReason] = _CODE_REASONS
    hints: Mapping[NvmlReason, str] = _HINTS

    def __init__(
        self,
        *,
        library_dir: str | None = None,
        call_timeout: float = 0.5,
        init_timeout: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        pcie: bool = True,
        child_env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Prepare the source; the child starts on the first ``sample()``.

        Args:
            library_dir: put first on the child's LD_LIBRARY_PATH (a simulated NVML); None:
                the system's libnvidia-ml.so.1.
            call_timeout: most seconds one ``sample()`` waits for the child.
            init_timeout: most seconds a new child may take to import the binding and init.
            backoff_initial: first wait before restarting a failed child; doubles per failure.
            backoff_max: ceiling of that wait.
            pcie: also read PCIe RX throughput (real drivers spend ~20 ms per GPU on it).
            child_env: extra environment for the child, e.g. ``SIMULATED_NVML_STATE``.
            clock: monotonic seconds; tests may pass their own.
        """
        self.rejected_process_records = 0
        self.child_starts = 0
        self.last_reading: GpuReading | None = None
        self._call_timeout = call_timeout
        self._init_timeout = init_timeout
        self._backoff_initial = self._backoff = backoff_initial
        self._backoff_max = backoff_max
        self._pcie = pcie
        self._clock = clock
        self._env = _child_env(library_dir, child_env or {})
        self._pid_max = _read_pid_max()
        self._worker: _Worker | None = None
        self._dying: list[_Worker] = []
        self._ready = self._described = self._worked = False
        self._in_flight = False
        self._retry_at = 0.0
        self._failure: NvmlReason | None = None
        self._warned: set[str] = set()
        self._process_api: str | None = None
        self._health = HealthTracker(self._warn_once)
        self._values = ValueCheck(self.name, self._warn_once)

    def sample(self, deadline: float | None = None) -> GpuReading:
        """One reading of every GPU and its compute processes.

        Args:
            deadline: ``time.monotonic()`` value to answer by; the call timeout bounds it.

        Raises:
            SourceError: NVML is unusable now; ``reason`` is an ``NvmlReason`` value.
        """
        deadline = min(
            self._clock() + self._call_timeout,
            float("inf") if deadline is None else deadline,
        )
        self._reap_dying()
        was_ready = self._ready
        worker = self._ready_worker(deadline)
        try:
            self._request(worker)
            line = worker.read_line(deadline, self._clock)
        except _WorkerGone:
            self._fail(NvmlReason.CRASHED, f"NVML child died while sampling {worker.exit_detail()}")
        if line is None:
            if not was_ready:
                # Asked only after this call waited for the child's init: give it a full turn.
                raise self._error(NvmlReason.STARTING, "first answer of a new NVML child pending")
            self._fail(NvmlReason.TIMEOUT, f"no answer within {self._call_timeout:g}s")
        self._in_flight = False
        return self._accept(cast(Reply, self._decode(line)))

    def _request(self, worker: _Worker) -> None:
        """Send a request unless one is already in flight."""
        if not self._in_flight:
            worker.send(REQUEST)
            self._in_flight = True

    def close(self) -> None:
        """Stop the child (EOF, then SIGKILL) and reap every child this source started."""
        if self._worker is not None:
            worker, self._worker = self._worker, None
            assert worker.process.stdin is not None  # Popen with stdin=PIPE
            worker.process.stdin.close()
            if not worker.reap(1.0):
                worker.kill()
                self._dying.append(worker)
        for worker in self._dying:
            worker.kill()
            worker.reap(1.0)
        self._dying.clear()

    def __enter__(self) -> GpuSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _ready_worker(self, deadline: float) -> _Worker:
        """The running, initialised child; starts one when the backoff allows."""
        if self._worker is None:
            if self._clock() < self._retry_at:
                raise self._error(self._failure or NvmlReason.STARTING, "waiting to retry")
            self._spawn()
        assert self._worker is not None
        if not self._ready:
            self._await_hello(self._worker, deadline)
        return self._worker

    def _spawn(self) -> None:
        argv = [sys.executable, "-m", self.worker_module]
        argv += [] if self._described else ["--describe"]
        argv += [] if self._pcie else ["--no-pcie"]
        try:
            self._worker = _Worker(argv, self._env, self._clock())
        except OSError as exc:
            self._fail(NvmlReason.SPAWN_FAILED, f"cannot start the NVML child: {exc}")
        self.child_starts += 1

    def _await_hello(self, worker: _Worker, deadline: float) -> None:
        """Wait for the child's init result, within this sample's deadline."""
        init_deadline = worker.started + self._init_timeout
        try:
            line = worker.read_line(min(deadline, init_deadline), self._clock)
        except _WorkerGone:
            self._fail(NvmlReason.CRASHED, f"NVML child died during init {worker.exit_detail()}")
        if line is None:
            if self._clock() >= init_deadline:
                self._fail(NvmlReason.TIMEOUT, f"NVML init took over {self._init_timeout:g}s")
            raise self._error(NvmlReason.STARTING, "NVML child still initialising")
        hello = cast(Hello, self._decode(line))
        if not hello.get("ok"):
            code = hello.get("code")
            reason = (
                NvmlReason.BINDING_MISSING
                if code is None
                else self.code_reasons.get(int(code), NvmlReason.INIT_FAILED)
            )
            self._fail(reason, f"nvmlInit code={code} message={hello.get('message')}")
        self._ready = self._worked = True
        self._log_binding(hello)

    def _decode(self, line: bytes) -> dict[str, object]:
        """A line from the child as an object, or a protocol failure.

        The caller reads it as ``Hello`` or ``Reply`` and converts field by field, so a
        malformed message fails the source as a protocol error, never as a wrong number.
        """
        message = decode_object(line)
        if message is None:
            self._fail(NvmlReason.PROTOCOL, "unreadable reply from the NVML child")
        return message

    def _accept(self, reply: Reply) -> GpuReading:
        """Turn a reply into a reading; a failed device listing fails the source."""
        code = reply.get("code")
        if code is not None:
            reason = self.code_reasons.get(int(code), NvmlReason.NVML_ERROR)
            self._fail(reason, f"nvmlDeviceGetCount code={code}")
        try:
            gpus = tuple(
                self._health.apply(with_health(with_mig_mode(self._values.gpu(raw), raw), raw))
                for raw in reply["gpus"]
            )
            migs = tuple(self._values.mig(raw) for raw in reply.get("migs", []))
            processes = _with_visibility(
                self._checked_processes(reply["procs"], gpus, reply.get("mig_procs", []), migs)
            )
        except (KeyError, TypeError, ValueError):
            self._fail(NvmlReason.PROTOCOL, "malformed reply from the NVML child")
        self._note_process_api(reply.get("process_api"))
        self._warn_invisible(processes)
        if self._failure is not None or self.last_reading is None:
            log.info("%s up gpus=%d after=%s", self.name, len(gpus), self._failure or "start")
        self._failure = None
        self._backoff = self._backoff_initial
        self.last_reading = GpuReading(gpus, processes, migs=migs)
        return self.last_reading

    def _checked_processes(
        self,
        raw: list[ProcessRecord],
        gpus: tuple[GpuSample, ...],
        mig_raw: list[MigProcessRecord] | None = None,
        migs: tuple[MigSample, ...] = (),
    ) -> tuple[GpuProcess, ...]:
        """Drop records no kernel or GPU could produce (binding/driver struct mismatch).

        A process on a MIG device is checked against that slice's memory, not the GPU's.
        """
        totals = {gpu.index: gpu.memory_total_bytes for gpu in gpus}
        slices = {mig.uuid: mig.memory_total_bytes for mig in migs}
        candidates = [
            (
                GpuProcess(int(gpu_index), int(pid), optional_int(used)),
                totals.get(int(gpu_index), -1),
            )
            for gpu_index, pid, used in raw
        ] + [
            (
                GpuProcess(int(gpu_index), int(pid), optional_int(used), mig_uuid=str(uuid)),
                slices.get(str(uuid), -1),
            )
            for gpu_index, uuid, pid, used in mig_raw or []
        ]
        kept: list[GpuProcess] = []
        rejected = 0
        for proc, total in candidates:
            fits = (
                proc.used_memory_bytes is None or total is None or proc.used_memory_bytes <= total
            )
            if 1 <= proc.pid <= self._pid_max and total != -1 and fits:
                kept.append(proc)
            else:
                rejected += 1
        if rejected:
            self.rejected_process_records += rejected
            self._warn_once(
                "rejected",
                "nvml process records rejected count=%d hint=%s",
                rejected,
                "pid or memory impossible: the binding's struct layout does not match the driver "
                "(nvitop#79); align nvidia-ml-py with the driver",
            )
        return tuple(kept)

    @property
    def rejected_values(self) -> int:
        """GPU and MIG readings out of range so far, each read as unknown."""
        return self._values.rejected

    def _note_process_api(self, api: object) -> None:
        if api is not None and api != self._process_api:
            self._process_api = str(api)
            log.info("%s process listing api=%s", self.name, api)

    def _warn_invisible(self, processes: tuple[GpuProcess, ...]) -> None:
        hidden = len({p.pid for p in processes if not p.visible})
        if hidden:
            self._warn_once(
                "invisible",
                "gpu processes outside our pid namespace count=%d hint=%s",
                hidden,
                "their memory is reported as unattributed; run in the host pid namespace "
                "(hostPID: true, docker --pid=host)",
            )

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _log_binding(self, hello: Hello) -> None:
        if self._described or "binding_path" not in hello:
            return
        self._described = True
        wheels = hello.get("binding_wheels") or {}
        log.info(
            "%s binding path=%s wheels=%s driver=%s",
            self.name,
            hello["binding_path"],
            ",".join(f"{name}=={version}" for name, version in sorted(wheels.items())) or "-",
            hello.get("driver"),
        )
        if len(wheels) > 1:
            log.warning(
                "both the pynvml and nvidia-ml-py wheels are installed; using path=%s",
                hello["binding_path"],
            )

    def _fail(self, reason: NvmlReason, detail: str) -> NoReturn:
        """Kill the child, schedule the next start after the backoff, and raise."""
        if self._worker is not None:
            self._worker.kill()
            self._dying.append(self._worker)
            self._worker = None
        self._ready = False
        self._in_flight = False
        self._retry_at = self._clock() + self._backoff
        error = self._error(reason, detail)
        if reason != self._failure and not isinstance(error, SourceAbsent):
            log.warning(
                "%s down reason=%s detail=%s hint=%s retry_in_s=%.1f",
                self.name,
                reason,
                detail,
                self.hints.get(reason, "-"),
                self._backoff,
            )
        self._backoff = min(self._backoff * 2, self._backoff_max)
        self._failure = reason
        if self.last_reading is not None and not self.last_reading.stale:
            self.last_reading = replace(self.last_reading, stale=True)
        raise error

    def _error(self, reason: NvmlReason, detail: str) -> SourceError:
        """Absent while the library was never there (the runner logs its hint once), else down.

        A retry's child that is still starting keeps an absent source absent: only its answer
        can say the library has come.
        """
        if reason is NvmlReason.STARTING and self._failure in ABSENT_REASONS:
            reason = self._failure
        if reason in ABSENT_REASONS and not self._worked:
            return SourceAbsent(reason, detail, hint=self.hints.get(reason, "-"))
        return SourceError(reason, detail)

    def _reap_dying(self) -> None:
        self._dying = [worker for worker in self._dying if not worker.reap(0)]
