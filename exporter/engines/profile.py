"""Log profile data types, plus the noise and failures every engine's log shares.

No I/O. The classifier in ``exporter.core.classify`` applies these; engine modules only fill them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from exporter.core.model import FailureReason, LogClass, Phase


@dataclass(frozen=True, slots=True)
class LogPattern:
    """One tolerant regular expression and what a matching line means.

    Attributes:
        regex: compiled, case-insensitive; searched, never anchored (prefixes vary by rank).
        cls: the class a matching line gets.
        marker: short marker name ("weights_begin", "cuda_graph", "ready", ...); for
            progress patterns, the progress key ("shards", "cuda_graph").
        phase: the phase a marker announces, if any.
        fatal_reason: for fatal patterns, the failure reason.
        per_model: progress of one model's weights; a speculative draft model's second bar
            gets the key prefixed with ``draft:``. Progress regexes name the groups ``done``
            and ``total``.
    """

    regex: re.Pattern[str]
    cls: LogClass
    marker: str | None = None
    phase: Phase | None = None
    fatal_reason: FailureReason | None = None
    per_model: bool = False


def pattern(
    regex: str,
    cls: LogClass,
    *,
    marker: str | None = None,
    phase: Phase | None = None,
    fatal_reason: FailureReason | None = None,
    per_model: bool = False,
) -> LogPattern:
    """Build a LogPattern from a case-insensitive regular expression."""
    return LogPattern(re.compile(regex, re.IGNORECASE), cls, marker, phase, fatal_reason, per_model)


def marker(regex: str, name: str, phase: Phase | None = None) -> LogPattern:
    """A marker line: evidence of progress, optionally announcing a phase."""
    return pattern(regex, LogClass.MARKER, marker=name, phase=phase)


def progress(regex: str, key: str, phase: Phase | None, *, per_model: bool = False) -> LogPattern:
    """A progress bar line; the regex names the groups ``done`` and ``total``."""
    return pattern(regex, LogClass.PROGRESS, marker=key, phase=phase, per_model=per_model)


def fatal(regex: str, reason: FailureReason) -> LogPattern:
    """A line that ends the cold start with a failure reason."""
    return pattern(regex, LogClass.FATAL, fatal_reason=reason)


def benign(regex: str) -> LogPattern:
    """Known noise: counted, never notable, never progress evidence."""
    return pattern(regex, LogClass.BENIGN)


def wrapper(regex: str) -> LogPattern:
    """A line announcing a traceback whose final exception line is the real cause."""
    return pattern(regex, LogClass.ERROR, marker="traceback", fatal_reason=FailureReason.CRASH)


@dataclass(frozen=True, slots=True)
class LogPatterns:
    """User additions to an engine's log profile (regular expressions from the config)."""

    benign: tuple[str, ...] = ()
    fatal: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LogProfile:
    """An engine's markers, fatal patterns and benign noise, checked fatal, benign, marker.

    Attributes:
        markers: phase markers and progress bars.
        fatal: lines that end a cold start; checked oom first, then nccl, then the rest.
        benign: known noise that must never alarm anyone.
        wrappers: lines such as "Scheduler hit an exception" whose traceback ends in the
            cause; that final exception line becomes fatal (crash unless it names oom/nccl).
        detect: lines that only this engine prints, for ``--engine auto``.
    """

    markers: tuple[LogPattern, ...] = field(default_factory=tuple)
    fatal: tuple[LogPattern, ...] = field(default_factory=tuple)
    benign: tuple[LogPattern, ...] = field(default_factory=tuple)
    wrappers: tuple[LogPattern, ...] = field(default_factory=tuple)
    detect: tuple[re.Pattern[str], ...] = field(default_factory=tuple)


_OOM = FailureReason.OOM
_NCCL = FailureReason.NCCL
_CRASH = FailureReason.CRASH

#: Failures any engine can print: PyTorch, CUDA/HIP, NCCL, the kernel and systemd.
COMMON_FATAL: Final[tuple[LogPattern, ...]] = (
    # tgi-02-oom ("torch.cuda.OutOfMemoryError: CUDA out of memory"), sglang-03-oom (HIP)
    fatal(r"\b(?:CUDA|HIP) out of memory|OutOfMemoryError\b", _OOM),
    # llamacpp-03-oom ("cudaMalloc failed: out of memory"), tgi-07-oom ("(out of memory)")
    fatal(r"cudaMalloc failed: out of memory|\(out of memory\)|CUDA error: out of memory", _OOM),
    fatal(r"CUDA_ERROR_OUT_OF_MEMORY|std::bad_alloc|Cannot allocate memory", _OOM),
    # fixtures README.md: an OOM kill leaves no engine line; systemd's "Failed with result
    # 'oom-kill'" (systemd src/core/service.c), read from the journal, is the only trace
    fatal(r"Failed with result '?oom-kill|Out of memory: Killed process", _OOM),
    # vllm-08-nccl, vllm-10-nccl ("NCCL error: unhandled system error", "... invalid usage")
    fatal(r"\bNCCL error:?\s*\w|\bnccl(?:System|Internal|UnhandledCuda|Remote)Error\b", _NCCL),
    # sglang-08-nccl ("NCCL WARN socketStartConnect: Connect to ... failed")
    fatal(r"\bNCCL WARN\b.*\b(?:fail\w*|error|abort\w*|timed? ?out)\b", _NCCL),
    # tgi-04-nccl ("[E ProcessGroupNCCL.cpp:828] ... Watchdog caught collective operation timeout")
    fatal(r"ProcessGroupNCCL.*(?:Watchdog caught|timed? ?out)|NCCL operations have failed", _NCCL),
    # trtllm-03-crash ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
    fatal(r"illegal memory access was encountered|CUDA_ERROR_ILLEGAL_ADDRESS", _CRASH),
    fatal(r"Segmentation fault|Fatal Python error|core dumped", _CRASH),
)

#: Noise every engine's log carries; none of it says anything about the cold start.
COMMON_BENIGN: Final[tuple[LogPattern, ...]] = (
    # ENGINES.md section 5 SGLang benign noise; DESIGN.md (CUTE_DSL package walk)
    benign(
        r"CUTE_DSL|Unexpected error during package (?:walk|packing)|cutlass\.cute\.experimental"
    ),
    # vllm-05-ready, sglang-01-crash ("[Gloo] Rank 0 is connected to 7 peer ranks")
    benign(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
    # vllm-05-ready: TensorFlow/XLA imported next to torch
    benign(r"Unable to register cu(?:FFT|DNN|BLAS) factory|computation placer already registered"),
    benign(
        r"absl::InitializeLog\(\)|oneDNN custom operations are on|TensorFlow binary is optimized"
    ),
    benign(r"^To enable the following instructions: "),
    # vllm-05-ready, sglang-03-oom ("`torch_dtype` is deprecated!"), sglang-05-ready
    benign(r"\bis deprecated\b|DeprecationWarning|FutureWarning"),
    # sglang-01-crash, sglang-05-ready: the source line Python prints under a UserWarning
    benign(r"^\s*_?warnings\.warn\("),
    # sglang-05/07-ready/other, vllm-03-other: Hugging Face Hub rate-limit notice
    benign(r"sending unauthenticated requests to the HF Hub"),
    # issue 5: printed on a normal SIGTERM stop of vLLM
    benign(r"\bEngineDeadError\b|destroy_process_group\(\) was not called"),
    # sglang-07-other: multiprocessing shutdown noise after an operator's kill
    benign(r"resource_tracker: There appear to be \d+ leaked"),
)
