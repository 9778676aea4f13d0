"""TensorRT-LLM (``trtllm-serve``) log profile, as data: markers, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it. Sources: ENGINES.md section 3 and the
fixtures in ``shared/fixtures/logs/trtllm-*.log``.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import (
    LogProfile,
    fatal,
    marker,
    progress,
)

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # trtllm-01-ready ("Starting trtllm-serve ...", "[TRT-LLM] [I] Using LLM with PyTorch")
        marker(r"Starting trtllm-serve|Using LLM with \w+ backend", "engine_init"),
        # trtllm-01-ready ("[TRT-LLM] [I] Use 63.32 GB for model weights.")
        marker(r"Use [\d.]+ [GM]i?B for model weights", "weights_begin", _L),
        # trtllm-01-ready ("Loading safetensors weights in parallel: 100%|...| 15/15")
        progress(
            r"Loading safetensors weights[^:]*:\s*\d+%\|[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)",
            "shards",
            _L,
            per_model=True,
        ),
        # trtllm-01-ready ("Loading weights: 100%|...| 801/801"): tensors, not files
        progress(
            r"Loading weights\s*:\s*\d+%\|[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)",
            "weights",
            _L,
            per_model=True,
        ),
        # trtllm-01-ready ("Model init total -- 49.14s")
        marker(r"Model init total\b", "weights_end", _I),
        # trtllm-01-ready ("[MemUsageChange] Allocated 0.56 GiB for max tokens in paged KV cache")
        marker(r"in paged KV cache|Estimated max memory in KV cache", "kv_cache", _I),
        marker(r"\[Autotuner\] Autotuning process (?:starts|ends)", "compile", _I),
        # trtllm-01-ready ("Creating CUDA graph instances", "Run generation only CUDA graph warmup")
        marker(r"Creating CUDA graph instances|CUDA graph warmup", "cuda_graph", _I),
        # trtllm-01-ready: uvicorn starts after the executor is built, so this is ready
        marker(r"Uvicorn running on|Application startup complete", "ready", _R),
    ),
    fatal=(
        # trtllm-03-crash ("[TRT-LLM] [E] Failed to initialize executor on rank 6: ...")
        fatal(r"Failed to initialize executor", FailureReason.CRASH),
        fatal(r"Executor worker (?:process )?\w* ?(?:died|failed)", FailureReason.CRASH),
    ),
    detect=(re.compile(r"\[TRT-LLM\]|TensorRT-LLM|trtllm-serve"),),
)
