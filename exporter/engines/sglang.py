"""SGLang's log profile, as data: phase markers, progress bars, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it. Sources: ENGINES.md section 5 (SGLang) and
the fixtures in ``shared/fixtures/logs/sglang-*.log``.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import (
    LogProfile,
    benign,
    fatal,
    marker,
    progress,
    wrapper,
)

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # ENGINES.md SGLang "starting"; sglang-04-ready ("Init torch distributed begin.")
        marker(r"server_args=ServerArgs\(", "server_args"),
        marker(r"Init torch distributed (?:begin|ends)", "distributed_init"),
        # ENGINES.md SGLang "loading"; sglang-04-ready ("[... TP3] Load weight begin. avail mem=")
        marker(r"Load weight begin", "weights_begin", _L),
        # sglang-04-ready (own lines), sglang-05-ready ("Multi-thread loading shards", CR-joined)
        progress(
            r"(?:Loading safetensors checkpoint shards|Multi-thread loading shards)\s*:\s*"
            r"\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)",
            "shards",
            _L,
            per_model=True,
        ),
        # ENGINES.md SGLang "weights done"; sglang-05-ready (again for the DFlash draft model)
        marker(r"Load weight end\b|Loading weights took", "weights_end", _I),
        # ENGINES.md SGLang "KV pool"; sglang-04-ready ("KV Cache is allocated. #tokens: 46611")
        marker(r"KV Cache is allocated|Memory pool end", "kv_cache", _I),
        # sglang-04-ready ("Capture cuda graph begin."), sglang-05-ready ("Capture target
        # prefill CUDA graph begin", "Capture draft verify CUDA graph end")
        marker(r"Capture [\w ]*cuda graph (?:begin|end)", "cuda_graph", _I),
        # sglang-05-ready ("Capturing batches (bs=1 avail_mem=6.72 GB): 100%|...| 8/8")
        progress(
            r"Capturing (?:batches|num tokens) \([^)]*\)\s*:\s*\d+%\|[^|]*\|\s*"
            r"(?P<done>\d+)/(?P<total>\d+)",
            "cuda_graph",
            _I,
        ),
        # ENGINES.md SGLang "init summary"; sglang-04-ready ("max_total_num_tokens=46611, ...")
        marker(r"max_total_num_tokens=|Engine startup timings", "scheduler_ready", _I),
        # ENGINES.md uvicorn; sglang-04-ready: HTTP is up, the warm-up request still runs
        marker(r"Uvicorn running on|Application startup complete", "http_up", _I),
        # ENGINES.md SGLang "HTTP up -> ready"; sglang-04-ready, sglang-05-ready
        marker(r"The server is fired up and ready to roll", "ready", _R),
        # sglang-05-ready: the operator's stop after ready
        marker(r"SIGTERM received\b", "stopping"),
    ),
    fatal=(
        # ENGINES.md SGLang "failed"
        fatal(r"Rank \d+ scheduler is dead", FailureReason.CRASH),
        fatal(r"Initialization failed\. (?:Please see|warmup error)", FailureReason.CRASH),
        fatal(r"Capture cuda graph failed", FailureReason.CRASH),
    ),
    benign=(
        # ENGINES.md SGLang benign noise; sglang-01-crash, sglang-03-oom
        benign(r"Ignore import error when loading sglang\."),
        # sglang-04-ready ("The following error message '...' can be ignored.") and that error
        benign(r"error message '.*' can be ignored|operation scheduled before its operands"),
        # sglang-01-crash, sglang-03-oom: AMD aiter/amdsmi noise on ROCm hosts
        benign(r"\[aiter\] type hints mismatch|Failed to import amdsmi|amdsmi_shut_down"),
        # sglang-05-ready: children ended by the operator's SIGTERM (-15), a stop not a crash
        benign(r"crashed with exit code -15\b"),
    ),
    wrappers=(
        # sglang-01-crash, sglang-03-oom: the cause is the traceback's last line
        wrapper(r"Scheduler hit an exception"),
        wrapper(r"DataParallelController hit an exception|TokenizerManager hit an exception"),
    ),
    detect=(
        re.compile(r"\bsglang\b|server_args=ServerArgs|fired up and ready to roll"),
        # sglang-15-oom (prefixes stripped): SGLang's weight-load and memory-fraction wording
        re.compile(r"^Load weight (?:begin|end)\. |--mem-fraction-static\b"),
        re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: DP\d+)?(?: TP\d+)(?: EP\d+)?\]"),
    ),
)
