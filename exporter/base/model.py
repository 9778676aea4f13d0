"""Plain, frozen data passed between sources, the lifecycle core and the renderers.

No I/O and no behaviour beyond trivial derived properties: every source converts what its
library returns into these types, so nothing untyped escapes a source.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final


class Phase(enum.StrEnum):
    """Lifecycle phase of a watched server; the values are public label values."""

    DOWN = "down"
    STARTING = "starting"
    #: The model is not local yet: the tree writes download files (bytes arriving count as
    #: progress; the download's time is kept apart from the load's).
    DOWNLOADING = "downloading"
    LOADING = "loading"
    INITIALIZING = "initializing"
    READY = "ready"
    SERVING = "serving"
    #: Put to sleep (vLLM sleep mode): weights offloaded, probes answer; neither down nor
    #: degraded, and its wake is no cold start.
    SLEEPING = "sleeping"
    DEGRADED = "degraded"
    FAILED = "failed"


#: Phases during which a cold start is in progress and the stall flag may be raised.
STARTUP_PHASES: frozenset[Phase] = frozenset(
    {Phase.STARTING, Phase.DOWNLOADING, Phase.LOADING, Phase.INITIALIZING}
)

#: Phases of a server at rest: its process tree is no longer the progress signal.
STEADY_PHASES: frozenset[Phase] = frozenset({Phase.READY, Phase.SERVING, Phase.SLEEPING})


class ProbeKind(enum.StrEnum):
    """Which endpoint a probe asked."""

    HEALTH = "health"
    COMPLETION = "completion"


class ProbeOutcome(enum.StrEnum):
    """Bounded outcome of one HTTP probe; used as the `/status` reason."""

    OK = "ok"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    BAD_BODY = "bad_body"
    BODY_TOO_LARGE = "body_too_large"
    TLS = "tls"
    UNAUTHORIZED = "unauthorized"
    REDIRECT = "redirect"
    ERROR = "error"


class LogClass(enum.StrEnum):
    """Class of one engine log line; the values are public label values."""

    MARKER = "marker"
    PROGRESS = "progress"
    INFO = "info"
    WARNING = "warning"
    BENIGN = "benign"
    ERROR = "error"
    FATAL = "fatal"


class FailureReason(enum.StrEnum):
    """Bounded reason a cold start ended without becoming ready."""

    EXITED = "exited"
    KILLED = "killed"
    OOM = "oom"
    NCCL = "nccl"
    CRASH = "crash"
    TIMEOUT = "timeout"
    #: The GPU the start runs on reported a critical Xid, an uncorrectable ECC error, or
    #: fell off the bus (``exporter.core.gpuhealth``).
    GPU_ERROR = "gpu_error"


#: Start times of one pid this close are one process (see ``ProcessSample.is_instance``).
SAME_START_SECONDS: Final = 1.0


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """The server's process tree at one instant (main process plus all descendants).

    Attributes:
        pid: the main process; used to tell a restart (new pid or new create_time) apart.
        create_time: main process start, Unix epoch seconds; a cold start is measured from it.
        pids: every pid of the tree, main first; used to attribute GPU memory, never exported.
        rss_bytes: summed resident memory of the tree.
        cpu_seconds: summed user+system CPU time of the tree.
        read_bytes: summed ``/proc/PID/io`` read_bytes (block-layer reads, which see mmap
            faults); None when it could not be read (see ``read_bytes_error``).
        read_bytes_error: bounded reason the read bytes are missing, e.g. "permission_denied".
        zombie: the main process has exited: not reaped yet, or (a sample of its pid and
            start time only) started since the last sample and ended before it.
        write_bytes: summed ``/proc/PID/io`` write_bytes (what the tree had written to
            storage: a model download lands here); None when it could not be read.
        download_files: files the tree holds open that are downloads in progress (Hugging
            Face's ``*.incomplete`` blobs and their kin); looked for only while it writes.
    """

    pid: int
    create_time: float
    pids: tuple[int, ...]
    rss_bytes: int
    cpu_seconds: float
    read_bytes: int | None
    read_bytes_error: str | None = None
    zombie: bool = False
    write_bytes: int | None = None
    download_files: int = 0

    @property
    def process_count(self) -> int:
        """Number of processes in the tree."""
        return len(self.pids)

    def is_instance(self, pid: int | None, create_time: float | None) -> bool:
        """This sample is of the process known as ``pid`` started at ``create_time``.

        The start times may differ by up to ``SAME_START_SECONDS``: the boot time behind them
        is read when the exporter starts and moves with NTP (exporters before 2026-12 read
        /proc/stat's whole seconds), so an exporter restarted days later, or a history an older
        one saved, reads the same process's start up to a second off. A reused pid is a new
        process only far apart in time (the pid space wraps first).
        """
        return (
            pid == self.pid
            and create_time is not None
            and abs(create_time - self.create_time) <= SAME_START_SECONDS
        )


@dataclass(frozen=True, slots=True)
class DiskSample:
    """Cumulative read bytes of whole disks (partitions and stacked devices excluded)."""

    read_bytes: int
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelState:
    """One model of a multi-model server as the server reports it (Triton's repository).

    ``state`` is the server's own word (Triton: ``LOADING``, ``READY``, ``UNAVAILABLE``);
    ``reason`` its explanation of an unavailable model, redacted and cut.
    """

    name: str
    version: str
    state: str
    reason: str | None = None

    @property
    def failed(self) -> bool:
        """The server gave up on this model: unavailable with a reason other than unloaded.

        Triton in explicit model control lists models not asked for yet as UNAVAILABLE,
        reason "unloaded": waiting, not failed.
        """
        reason = (self.reason or "").strip().lower()
        return self.state.upper() == "UNAVAILABLE" and reason not in ("", "unloaded")


@dataclass(frozen=True, slots=True)
class EngineReport:
    """What an engine says about its own startup (ENGINES.md section 8); None: unsaid.

    Attributes:
        load_seconds: the weights' load, as the engine timed it.
        startup_seconds: its whole startup, as it timed it.
        steps: its own startup steps and their seconds, in its own names.
        models: per-model load states of a multi-model server.
    """

    load_seconds: float | None = None
    startup_seconds: float | None = None
    steps: tuple[tuple[str, float], ...] = ()
    models: tuple[ModelState, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One HTTP probe of a target's endpoint.

    Attributes:
        kind: health or completion.
        outcome: bounded outcome; only ``OK`` counts as success.
        status_code: HTTP status when a response arrived.
        duration_seconds: wall time of the probe, bounded by its deadline.
        has_choices: a completion reply carried a non-empty ``choices`` list.
        loading: the reply said the engine is still loading (llama.cpp "Loading model").
        sleeping: asked after a good health probe, the engine said it sleeps (or not).
        at: when the probe finished, Unix epoch seconds.
    """

    kind: ProbeKind
    outcome: ProbeOutcome
    status_code: int | None
    duration_seconds: float
    at: float
    has_choices: bool = False
    loading: bool = False
    #: The engine says it is in sleep mode (vLLM ``/is_sleeping``); None when it does not say.
    sleeping: bool | None = None
    #: What the engine reports about its own startup, asked beside the health probe.
    report: EngineReport | None = None

    @property
    def ok(self) -> bool:
        """True when the probe succeeded."""
        return self.outcome is ProbeOutcome.OK


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU as its vendor library reported it in one sample; unsupported fields are None."""

    index: int
    uuid: str
    name: str
    up: bool
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    error: str | None = None
    #: MIG mode now, and after the next GPU reset; None where the GPU cannot do MIG.
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    #: Who made it: "nvidia" (NVML) or "amd" (amd-smi).
    vendor: str = "nvidia"
    # GPU health (exporter.core.gpuhealth reads them); None: unsupported here, never 0.
    #: Xid codes of the critical-error events NVML delivered in this sample (new ones only).
    xids: tuple[int, ...] = ()
    #: Xid events counted since the exporter started, by raw code, lowest first (the core's
    #: ``gpuhealth.xid_label_counts`` folds them into the bounded ``xid`` label values).
    xid_counts: tuple[tuple[int, int], ...] = ()
    #: Uncorrectable ECC errors since the driver loaded (NVML's volatile count, amd-smi's RAS).
    ecc_uncorrected_volatile: int | None = None
    #: Growth of ``ecc_uncorrected_volatile`` since the previous sample of this GPU.
    ecc_uncorrected_new: int = 0
    retired_pages_pending: bool | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    #: NVML's clocks event reasons bitmask (``gpuhealth.THROTTLE_REASONS`` names the bits).
    throttle_reasons: int | None = None
    pcie_link_generation: int | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    #: Health readings this GPU or its driver cannot give (``HEALTH_READINGS`` names).
    unsupported: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MigSample:
    """One MIG device (a slice of a MIG-enabled GPU) as NVML reported it in one sample.

    Its own type, not a ``GpuSample``: a slice has no utilisation, PCIe or up/down of its own,
    and everything keyed by GPU index (trails, totals, per-GPU series) stays about whole GPUs.

    Attributes:
        gpu_index: the parent GPU's index.
        uuid: the MIG device's UUID (``MIG-...``), what ``CUDA_VISIBLE_DEVICES`` names.
        gpu_instance_id: the GPU instance (dcgm-exporter's ``GPU_I_ID``).
        compute_instance_id: the compute instance within it.
        profile: the profile, e.g. ``1g.10gb`` (dcgm-exporter's ``GPU_I_PROFILE``), if known.
    """

    gpu_index: int
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """Memory one process holds on one GPU (joined to targets by pid, never exported by pid)."""

    gpu_index: int
    pid: int
    used_memory_bytes: int | None
    #: The pid exists in our PID namespace (False: a process we cannot see); a fact about
    #: where we look from, not about the record, so equality ignores it.
    visible: bool = field(default=True, compare=False)
    #: The MIG device (``MIG-...`` UUID) the process runs on; None on a whole GPU.
    mig_uuid: str | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """Everything one NVML sample returned."""

    gpus: tuple[GpuSample, ...]
    processes: tuple[GpuProcess, ...] = ()
    stale: bool = False
    #: The MIG devices of MIG-enabled GPUs.
    migs: tuple[MigSample, ...] = ()


@dataclass(frozen=True, slots=True)
class RawLogLine:
    """One engine log line as its source read it, not yet classified nor redacted.

    The core redacts the few lines it keeps (events), once; a line that matches nothing is
    only counted. Never shown or logged as it is.

    Attributes:
        text: the line as written (ANSI codes and carriage-return redraws kept).
        at: when it was read, or journald's timestamp; Unix epoch seconds.
        line_no: 1-based line number in its file, when known.
    """

    text: str
    at: float
    line_no: int | None = None


#: Longest log record kept, in bytes: the rest of a longer line is never looked at.
MAX_RECORD_BYTES: Final = 8192


@dataclass(frozen=True, slots=True)
class LogBlock:
    r"""Complete log records read from a file in one go: bytes, neither split nor decoded.

    A serving engine writes thousands of lines a second that matter to no one; the core
    screens the whole block in one linear scan and splits and decodes only the few records
    the screen cannot rule out, so no object is made per line.

    Attributes:
        data: whole records, each ending in ``\n`` (a line) or ``\r`` (a progress redraw
            on the same line); not UTF-8-checked.
        at: when the block was read; Unix epoch seconds.
        first_line_no: the 1-based line number of the first record in its file (0: it
            continues a line begun before the first line read), None when unknown.
    """

    data: bytes = b""
    at: float = 0.0
    first_line_no: int | None = None


@dataclass(frozen=True, slots=True)
class LogReading:
    """What a log source read in one tick, and how far behind the log it still is.

    Attributes:
        lines: the lines read one by one (journald's entries), not yet classified nor
            redacted.
        backlog_bytes: bytes written to the log and not read yet (0 when caught up), None
            from a source that cannot tell (journald): the snapshot then shows no backlog.
        behind_since: when the source fell behind (read less than was there), None when
            caught up: ``now - behind_since`` is how late its lines are.
        block: what a file source read, after ``lines`` in the log's order.
    """

    lines: tuple[RawLogLine, ...] = ()
    backlog_bytes: int | None = None
    behind_since: float | None = None
    block: LogBlock | None = None


@dataclass(frozen=True, slots=True)
class ModelSize:
    """The size of a target's model weights on disk, for read-based progress.

    Attributes:
        weights_bytes: bytes of the weight files at the model path (the file itself, or the
            files with a weights suffix under the directory); None when unknown: no such
            path, no weight files, or too many files to be a model (a path of ``/``).
    """

    weights_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryPressure:
    """The host's memory pressure (Linux PSI, ``/proc/pressure/memory``).

    Attributes:
        some_ratio: share of the last 10 s in which at least one task stalled on memory.
        full_ratio: share of the last 10 s in which every non-idle task stalled on memory.
        some_seconds: total time at least one task stalled, since boot.
        full_seconds: total time every non-idle task stalled, since boot.
    """

    some_ratio: float
    full_ratio: float
    some_seconds: float
    full_seconds: float


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One classified engine log line (already redacted; safe to show).

    Attributes:
        cls: the line's class.
        text: the line, ANSI stripped, secrets redacted, length capped.
        at: timestamp parsed from the line, or when it was read; Unix epoch seconds.
        phase: the phase a marker line announces (loading, initializing, ready), if any.
        marker: short name of the marker matched, e.g. "weights_begin", "cuda_graph".
        progress: shard progress ``(done, total)`` from a progress bar, if any.
        progress_key: what the progress counts ("shards", "draft:shards"); aggregates ranks.
        fatal_reason: the failure reason a fatal line implies.
        line_no: 1-based line number in its source, when known.
        repeat: the same line as the one before it, numbers aside (a flood): weak evidence.
        loader: the fast weight loader the line names ("runai-streamer", "tensorizer", ...).
        loader_bytes_per_second: the throughput a loader's summary line reports.
    """

    cls: LogClass
    text: str
    at: float
    phase: Phase | None = None
    marker: str | None = None
    progress: tuple[int, int] | None = None
    progress_key: str | None = None
    fatal_reason: FailureReason | None = None
    line_no: int | None = None
    repeat: bool = False
    loader: str | None = None
    loader_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class LogTally:
    """A tick's log lines that matched no pattern: counted by class, never kept.

    Attributes:
        counts: lines per class (info, and benign for request access lines).
        news: one of the info lines differed from the line before it, numbers aside: a sign
            of life, where a flood of one repeated line is none.
    """

    counts: tuple[tuple[LogClass, int], ...] = ()
    news: bool = False


@dataclass(frozen=True, slots=True)
class HostReadings:
    """What the host-wide sources (other than NVML) read in one tick.

    Each field is named after the source that fills it (``Source.name``) and is None when
    that source is absent or failed this tick; a new host source adds one field here.
    """

    disk: DiskSample | None = None
    memory_pressure: MemoryPressure | None = None


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """How one source call went: the node_exporter ``scrape_collector_success`` pattern.

    ``absent`` (with ``up`` false): what the source reads is not on this host, which is no
    failure; ``hint`` then names what is missing and the key that turns the source off.
    """

    source: str
    up: bool
    duration_seconds: float
    error: str | None = None
    target: str | None = None
    absent: bool = False
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything observed about one target in one tick; the lifecycle core's only input.

    A field is None when its source is not configured or failed this tick (the source's
    status says which); ``process is None`` with ``process_error is None`` means no process.
    """

    target: str
    at: float
    process: ProcessSample | None = None
    process_error: str | None = None
    health: ProbeResult | None = None
    completion: ProbeResult | None = None
    disk_read_bytes: int | None = None
    gpu_memory_bytes: int | None = None
    log_events: tuple[LogEvent, ...] = field(default_factory=tuple)
    #: The tick's lines no pattern matched: counted by class, never made events.
    log_tally: LogTally = field(default_factory=lambda: LogTally())
    #: Critical GPU events this tick on the GPUs the target uses, for people
    #: (``gpuhealth.gpu_errors``), e.g. "Xid 79 on GPU 0 (GPU has fallen off the bus)".
    gpu_errors: tuple[str, ...] = ()
