"""What a simulated cold start does, as data: flags, scenarios and the weight-file layout.

Pure: no I/O, no clock. The orchestrator in ``coldstart`` turns this plan into processes and time.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The simulated GPUs' model name unless ``--gpu-name`` says otherwise.
GPU_NAME: Final = "NVIDIA-H100-80GB-HBM3"
MIB: Final = 1 << 20
#: O_DIRECT needs offsets and lengths aligned to the logical block size; a page covers every disk.
ALIGN: Final = 4096
#: Safetensors checkpoints come in several shard files; the shard bar counts them.
SHARDS: Final = 5


class SimEngine(enum.StrEnum):
    """Engines whose cold start the simulator can imitate (values match ``exporter.engines``)."""

    SGLANG = "sglang"
    VLLM = "vllm"
    LLAMACPP = "llamacpp"


class Scenario(enum.StrEnum):
    """How the simulated cold start goes; the values are the ``--scenario`` choices."""

    HEALTHY = "healthy"
    SLOW = "slow"
    HANG_LOADING = "hang-loading"
    HANG_INITIALIZING = "hang-initializing"
    CRASH_LOADING = "crash-loading"
    OOM_INITIALIZING = "oom-initializing"
    FLAP = "flap"
    SLEEP_WAKE = "sleep-wake"
    DOWNLOAD = "download"
    ORPHANED_WORKERS = "orphaned-workers"
    HANG_DOWNLOADING = "hang-downloading"
    XID_LOADING = "xid-loading"
    #: One scenario per bound of a phase (``exporter.core.bounds``), for ``demo`` and tests.
    THROTTLED_DISK = "throttled-disk"
    WARM_CACHE = "warm-cache"
    COMPILE = "compile"
    GPU_WARMUP = "gpu-warmup"
    RENDEZVOUS = "rendezvous"


@dataclass(frozen=True, slots=True)
class ScenarioPlan:
    """The knobs one scenario turns.

    Attributes:
        rate_factor: multiplies ``--read-mbps``.
        init_factor: multiplies ``--init-seconds``.
        quiet: no log lines inside loading and initializing, only at their edges.
        hang_load_at: fraction of the weights after which reading stops for good.
        crash_load_at: fraction of the weights after which the engine crashes.
        hang_init: initializing stops for good right after the KV cache is allocated.
        oom_init: initializing dies of a CUDA OOM where CUDA graphs would be captured.
        flap: once ready, health alternates between 200 and 503 every ``--flap-seconds``.
        sleep_wake: once ready, vLLM's sleep mode: asleep (weights offloaded) and awake
            again, each for ``--flap-seconds``, with vLLM's log lines and ``/is_sleeping``.
        download: the weights are downloaded first (``*.incomplete`` files written at
            ``--read-mbps``), then loaded.
        hang_download_at: fraction of the download after which it stops for good.
        orphan_workers: the crash leaves the workers alive, holding their GPU memory, for
            four ``--flap-seconds`` (vLLM and Dynamo issues report such leftovers).
        xid_load_at: fraction of the weights after which GPU 0 reports Xid 79 (fallen off
            the bus) through the fake NVML's event API; with ``hang_load_at`` the load hangs
            there, as a real one does when its GPU is gone.
        warm_cache: the weights stay in the page cache after they are written and the
            workers read through it: a warm start, with next to no device reads.
        compile: initializing compiles first for twice ``--init-seconds``, a core busy and
            the GPU flat, and its graph capture barely moves the GPU (a torch.compile
            cache miss).
        gpu_warmup: initializing keeps the GPUs busy throughout with the CPU idle.
        rendezvous: before the workers start, the engine waits ``rendezvous_seconds`` for
            the other ranks, saying so as torch's store-based barrier does.
    """

    rate_factor: float = 1.0
    init_factor: float = 1.0
    quiet: bool = False
    hang_load_at: float | None = None
    crash_load_at: float | None = None
    hang_init: bool = False
    oom_init: bool = False
    flap: bool = False
    sleep_wake: bool = False
    download: bool = False
    hang_download_at: float | None = None
    orphan_workers: bool = False
    xid_load_at: float | None = None
    warm_cache: bool = False
    compile: bool = False
    gpu_warmup: bool = False
    rendezvous: bool = False


SCENARIOS: Final[dict[Scenario, ScenarioPlan]] = {
    Scenario.HEALTHY: ScenarioPlan(),
    # A slow disk and a long silent compile: progress shows only in read_bytes, CPU and GPU memory.
    Scenario.SLOW: ScenarioPlan(rate_factor=0.5, init_factor=2.0, quiet=True),
    Scenario.HANG_LOADING: ScenarioPlan(hang_load_at=0.5),
    Scenario.HANG_INITIALIZING: ScenarioPlan(hang_init=True),
    Scenario.CRASH_LOADING: ScenarioPlan(crash_load_at=0.5),
    Scenario.OOM_INITIALIZING: ScenarioPlan(oom_init=True),
    Scenario.FLAP: ScenarioPlan(flap=True),
    Scenario.SLEEP_WAKE: ScenarioPlan(sleep_wake=True),
    Scenario.DOWNLOAD: ScenarioPlan(download=True),
    Scenario.ORPHANED_WORKERS: ScenarioPlan(crash_load_at=0.5, orphan_workers=True),
    Scenario.HANG_DOWNLOADING: ScenarioPlan(download=True, hang_download_at=0.5),
    Scenario.XID_LOADING: ScenarioPlan(hang_load_at=0.5, xid_load_at=0.4),
    Scenario.THROTTLED_DISK: ScenarioPlan(rate_factor=0.25),
    # The page cache serves reads several times faster than the simulated disk.
    Scenario.WARM_CACHE: ScenarioPlan(rate_factor=4.0, warm_cache=True),
    Scenario.COMPILE: ScenarioPlan(compile=True),
    Scenario.GPU_WARMUP: ScenarioPlan(init_factor=2.0, gpu_warmup=True),
    Scenario.RENDEZVOUS: ScenarioPlan(rendezvous=True),
}


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Validated simulator settings (the ``simulate`` flags).

    Attributes:
        port: TCP port of the engine's HTTP server.
        host: address it binds.
        engine: which engine to imitate.
        weights_mb: size of the weight files it creates and reads, in MiB.
        read_mbps: aggregate read rate of the workers, in MiB/s.
        start_seconds: length of the starting phase (imports, distributed init).
        init_seconds: length of the initializing phase (KV cache, compile, CUDA graphs).
        scenario: how the start goes.
        gpus: simulated GPUs, one worker process per GPU (tensor parallel ranks).
        flap_seconds: length of each healthy and each failing stretch of the ``flap`` scenario.
        log_file: where engine log lines go; None means stderr.
        pid_file: written with the main pid at start.
        gpu_state_file: where the simulated GPU state is published; None publishes nothing.
        work_dir: where the weight files are created; None means a fresh temporary directory.
    """

    port: int
    host: str = "127.0.0.1"
    engine: SimEngine = SimEngine.SGLANG
    weights_mb: int = 640
    read_mbps: float = 25.0
    start_seconds: float = 5.0
    init_seconds: float = 20.0
    scenario: Scenario = Scenario.HEALTHY
    gpus: int = 1
    gpu_name: str = GPU_NAME
    flap_seconds: float = 3.0
    log_file: Path | None = None
    pid_file: Path | None = None
    gpu_state_file: Path | None = None
    work_dir: Path | None = None

    @property
    def plan(self) -> ScenarioPlan:
        """The scenario's knobs."""
        return SCENARIOS[self.scenario]

    @property
    def weights_bytes(self) -> int:
        """Total size of the weight files."""
        return self.weights_mb * MIB

    @property
    def read_bytes_per_second(self) -> float:
        """Aggregate read rate after the scenario's factor."""
        return self.read_mbps * MIB * self.plan.rate_factor

    @property
    def init_duration(self) -> float:
        """Length of initializing after the scenario's factor."""
        return self.init_seconds * self.plan.init_factor


@dataclass(frozen=True, slots=True)
class Segment:
    """One shard of the weights: a byte range of one file, read by every worker in turn.

    Attributes:
        path: the file.
        offset: first byte, aligned to ``ALIGN``.
        length: bytes, a multiple of ``ALIGN``.
    """

    path: Path
    offset: int
    length: int


def shard_sizes(total: int, shards: int) -> list[int]:
    """Split ``total`` bytes into ``shards`` aligned sizes; the last one takes the remainder.

    Shards that would be empty are dropped, so tiny weights still give at least one shard.
    """
    base = total // shards // ALIGN * ALIGN
    sizes = [base] * (shards - 1) + [total - base * (shards - 1)]
    return [s for s in sizes if s > 0]


def weight_layout(engine: SimEngine, directory: Path, total: int) -> list[Segment]:
    """Where the weights live: safetensors shard files, or one GGUF read in several segments."""
    sizes = shard_sizes(total, SHARDS)
    if engine is SimEngine.LLAMACPP:
        path = directory / "model-Q8_0.gguf"
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        return [Segment(path, off, size) for off, size in zip(offsets, sizes, strict=True)]
    n = len(sizes)
    return [
        Segment(directory / f"model-{i + 1:05d}-of-{n:05d}.safetensors", 0, size)
        for i, size in enumerate(sizes)
    ]


def chunk_size(bytes_per_second: float) -> int:
    """Read size that gives about 20 reads a second, between 64 KiB and 1 MiB, block aligned."""
    wanted = int(bytes_per_second / 20)
    return max(64 * 1024, min(MIB, wanted)) // ALIGN * ALIGN


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What one worker does, passed to it as JSON on its command line.

    Attributes:
        rank: this worker's index; it reads every ``world``-th chunk starting at ``rank``.
        world: number of workers.
        parent: pid of the simulator; a different parent means it died.
        segments: the weight shards, in reading order.
        bytes_per_second: this worker's read rate.
        stop_after: stop reading for good after this many bytes (the hang scenario).
        cleanup: files to remove when the parent died without removing them.
        cleanup_dir: directory to remove (when empty) after those files.
        linger_seconds: after the parent died, live on this long holding the GPU, as a
            worker left behind by a crashed engine does (0: die with the parent).
        gpu_state: the simulated GPU state file, emptied when a lingering worker ends (the
            driver frees a process's memory when it exits).
        warm: read through the page cache (the weights are cached): no device reads.
    """

    rank: int
    world: int
    parent: int
    segments: tuple[Segment, ...]
    bytes_per_second: float
    stop_after: int | None = None
    cleanup: tuple[Path, ...] = ()
    cleanup_dir: Path | None = None
    linger_seconds: float = 0.0
    gpu_state: Path | None = None
    warm: bool = False

    def to_json(self) -> str:
        """Encode for the worker's command line."""
        return json.dumps(
            {
                "rank": self.rank,
                "world": self.world,
                "parent": self.parent,
                "segments": [[str(s.path), s.offset, s.length] for s in self.segments],
                "bytes_per_second": self.bytes_per_second,
                "stop_after": self.stop_after,
                "cleanup": [str(p) for p in self.cleanup],
                "cleanup_dir": str(self.cleanup_dir) if self.cleanup_dir else None,
                "linger_seconds": self.linger_seconds,
                "gpu_state": str(self.gpu_state) if self.gpu_state else None,
                "warm": self.warm,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> WorkerPlan:
        """Decode what ``to_json`` wrote."""
        raw = json.loads(text)
        return cls(
            rank=int(raw["rank"]),
            world=int(raw["world"]),
            parent=int(raw["parent"]),
            segments=tuple(Segment(Path(p), int(o), int(n)) for p, o, n in raw["segments"]),
            bytes_per_second=float(raw["bytes_per_second"]),
            stop_after=None if raw["stop_after"] is None else int(raw["stop_after"]),
            cleanup=tuple(Path(p) for p in raw["cleanup"]),
            cleanup_dir=Path(raw["cleanup_dir"]) if raw["cleanup_dir"] else None,
            linger_seconds=float(raw.get("linger_seconds", 0.0)),
            gpu_state=Path(raw["gpu_state"]) if raw.get("gpu_state") else None,
            warm=bool(raw.get("warm", False)),
        )
