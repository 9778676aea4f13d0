"""The lifecycle core: (previous state, observation, now) -> new state. Pure: no I/O, no clock.

Theory of operation
-------------------
Phases (DESIGN.md): ``down -> starting -> loading -> initializing -> ready -> serving``, plus
``degraded`` (was ready, probes now fail, process alive) and ``failed`` (the start ended without
becoming ready). Within one cold start the startup phases only move forward; a new process
instance (new pid or a reused pid with a new create_time) begins a new cold start.

Readiness comes from the health probe, never from guesses: the engines that matter refuse
connections until ready (vLLM, SGLang, TGI, Triton), so "connection refused + live process" is
a startup phase, not ``down``. Where no probe runs (``replay-log``), a log line announcing
readiness stands in for it.

Progress evidence, per tick, is any of: process-tree ``read_bytes`` growth (block-layer reads,
which see mmap'd safetensors), GPU memory change, RSS growth (a warm page cache shows no reads
at all, only residency), a log line that is not benign noise, shard progress, new processes in
the tree (compilers), or CPU time above a small floor. GPU utilisation alone is never evidence:
an NCCL hang shows 100 %. Disk counters are evidence only when present; their absence never
raises a stall on its own.

Stall is a flag on the startup phases: no evidence for longer than the phase's threshold. The
caller passes thresholds in (configured, or learned from this target's history) so a server
whose initialisation is silent for ten minutes every time pages no one.

Time is an argument (``now``) so traces replay exactly and tests need neither sleeps nor clock
patching. The cold start's duration is measured from the process create_time, so it survives
an exporter restart.

Layout: ``state`` (the records and the rules every stage shares), ``evidence`` (what moved
this tick), ``phase`` (the one place that decides the phase), ``progress`` (shards, rates,
ratio, ETA, stall), ``tracking`` (counters, transitions, instances, finished starts) and
``step``, which runs them in order. This package keeps every public name importable here.
"""

from exporter.base.records import ColdStart, SavedStart, Transition
from exporter.core.lifecycle.phase import Health
from exporter.core.lifecycle.state import (
    COLD_START_BUCKETS,
    CPU_EVIDENCE_CORES,
    DEFAULT_STALL_SECONDS,
    DISAGREE_SECONDS,
    DISAGREE_SHARE,
    DOWNLOAD_RATE_WEIGHT,
    ETA_MIN_SECONDS,
    GPU_EVIDENCE_BYTES,
    GPU_PLATEAU_SECONDS,
    LEARNED_STALL_MULTIPLE,
    LOAD_READ_FLOOR_BYTES,
    LOAD_READ_SHARE,
    NOTABLE_LINES_KEPT,
    PROBE_MARGIN,
    PROBE_PERIOD_SECONDS,
    RSS_EVIDENCE_BYTES,
    STALL_FLOOR_SECONDS,
    TIMESTAMP_FIELDS,
    TRANSITIONS,
    TRANSITIONS_KEPT,
    UP_PHASES,
    WAKE_BUCKETS,
    Baseline,
    Counters,
    Histogram,
    TargetState,
    Thresholds,
    Wake,
    initial_state,
    learned_stall_seconds,
    load_disagreement,
    observed_load_seconds,
    phase_durations_total,
    probe_verdict,
    resume,
    saved_start,
    shifted,
    startup_probe_advice,
)
from exporter.core.lifecycle.step import step

__all__ = [
    "COLD_START_BUCKETS",
    "CPU_EVIDENCE_CORES",
    "DEFAULT_STALL_SECONDS",
    "DISAGREE_SECONDS",
    "DISAGREE_SHARE",
    "DOWNLOAD_RATE_WEIGHT",
    "ETA_MIN_SECONDS",
    "GPU_EVIDENCE_BYTES",
    "GPU_PLATEAU_SECONDS",
    "LEARNED_STALL_MULTIPLE",
    "LOAD_READ_FLOOR_BYTES",
    "LOAD_READ_SHARE",
    "NOTABLE_LINES_KEPT",
    "PROBE_MARGIN",
    "PROBE_PERIOD_SECONDS",
    "RSS_EVIDENCE_BYTES",
    "STALL_FLOOR_SECONDS",
    "TIMESTAMP_FIELDS",
    "TRANSITIONS",
    "TRANSITIONS_KEPT",
    "UP_PHASES",
    "WAKE_BUCKETS",
    "Baseline",
    "ColdStart",
    "Counters",
    "Health",
    "Histogram",
    "SavedStart",
    "TargetState",
    "Thresholds",
    "Transition",
    "Wake",
    "initial_state",
    "learned_stall_seconds",
    "load_disagreement",
    "observed_load_seconds",
    "phase_durations_total",
    "probe_verdict",
    "resume",
    "saved_start",
    "shifted",
    "startup_probe_advice",
    "step",
]
