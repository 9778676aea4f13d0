"""vLLM's log profile, as data: phase markers, progress bars, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it. Sources: ENGINES.md section 5 (vLLM) and
the fixtures in ``shared/fixtures/logs/vllm-*.log``.
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
        # ENGINES.md vLLM "starting"; vllm-05-ready, vllm-06-ready
        marker(r"Initializing an? (?:V1 )?LLM engine", "engine_init"),
        # ENGINES.md vLLM "loading"; vllm-05-ready ("Starting to load model meta-llama/...")
        marker(r"Starting to load (?:draft )?model\b|Loading drafter model", "weights_begin", _L),
        marker(r"Loading model from scratch|Using model weights format", "weights_loader", _L),
        # vllm-05/06-ready ("Loading safetensors checkpoint shards:  25% Completed | 1/4"); the
        # fast loaders' bars ("using InstantTensor loader", "using Runai Model Streamer")
        progress(
            r"Loading (?:safetensors|pt|\w+) (?:checkpoint shards|using \w+(?: \w+){0,3}?)\s*:\s*"
            r"\d+% Completed \| (?P<done>[\d.]+[KMGT]?)/(?P<total>[\d.]+[KMGT]?)",
            "shards",
            _L,
            per_model=True,
        ),
        # ENGINES.md vLLM "weights done"; vllm-06-ready ("Loading weights took 3.83 seconds"),
        # V0's model_runner.py (vllm-15/16-ready: "Loading model weights took 7.5122 GB")
        marker(r"Loading (?:model )?weights took|Model loading took", "weights_end", _I),
        # ENGINES.md vLLM "compile"; vllm-05-ready ("Compiling a graph for dynamic shape takes")
        marker(r"for vLLM's torch\.compile|Dynamo bytecode transform time", "compile", _I),
        marker(
            r"Compiling a graph for|torch\.compile (?:takes|took)|load the compiled graph",
            "compile",
            _I,
        ),
        # ENGINES.md vLLM "memory profile / KV"; vllm-05-ready ("GPU KV cache size: 38,944")
        marker(
            r"Available KV cache memory|GPU KV cache size|Maximum concurrency for", "kv_cache", _I
        ),
        # vllm-05-ready ("Capturing CUDA graphs (decode, FULL):   5%|... | 1/19")
        progress(
            r"(?:Capturing CUDA graphs?(?: shapes)?|Profiling CUDA graph memory)[^:]*:\s*\d+%\|"
            r"[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)",
            "cuda_graph",
            _I,
        ),
        # ENGINES.md vLLM "CUDA graphs"; vllm-06-ready ("Graph capturing finished in 33 secs")
        marker(r"Graph capturing finished|Capturing CUDA graph", "cuda_graph", _I),
        # vllm-27-crash: vLLM-Ascend captures ACL graphs where CUDA hosts capture CUDA graphs
        marker(r"Capturing ACL graphs?|ACL graph capturing finished", "cuda_graph", _I),
        # ENGINES.md vLLM "engine ready"; vllm-06-ready ("init engine (profile, ...) took 57.31")
        marker(r"init engine \(profile, create kv cache, warmup model\) took", "engine_ready", _I),
        marker(r"Core engine process \d+ ready", "engine_ready", _I),
        # ENGINES.md vLLM "HTTP up"; vllm-05-ready ("Starting vLLM API server 0 on http://")
        marker(r"Starting vLLM (?:API )?server\b|Available routes are", "http_up", _I),
        # ENGINES.md uvicorn; vllm-05/06-ready: the socket was pre-bound, so this is ready
        marker(r"Application startup complete", "ready", _R),
    ),
    fatal=(
        # ENGINES.md vLLM "failed" ("No available memory for the cache blocks")
        fatal(r"No available memory for the cache blocks", FailureReason.OOM),
        # ENGINES.md vLLM "failed": wrapper printed after its cause
        fatal(
            r"Engine core initialization failed|Engine process failed to start", FailureReason.CRASH
        ),
        # vllm-10-nccl ("CRITICAL ... Got fatal signal from worker processes, shutting down")
        fatal(r"Got fatal signal from worker processes", FailureReason.CRASH),
    ),
    benign=(
        # ENGINES.md vLLM "alive, silent": printed every 60 s whether or not work progresses
        benign(r"No available shared memory broadcast block found"),
        # vllm-27-crash: vLLM-Ascend without its compiled ops still starts (a warning, and the
        # real cause only if a later line fails)
        benign(r"Failed to import vllm_ascend_C|Sleep mode will be disabled"),
        # vllm-05-ready: glog lines of TensorFlow's own import
        benign(r"^[EW]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \w+\.cc:\d+\]"),
    ),
    wrappers=(
        # vllm-10-nccl ("EngineCore hit an exception: Traceback"), vllm-08-nccl (worker form)
        wrapper(r"EngineCore (?:hit|encountered) an exception|EngineCore failed to start"),
        wrapper(r"Exception in worker \w+ while processing method"),
    ),
    detect=(
        re.compile(r"\bvLLM\b|\(EngineCore(?:_DP)?\d* pid=|\(APIServer pid=|\(VllmWorker"),
        # vllm-28-crash ("vllm: command not found"), vllm-27-crash (vllm_ascend), paths
        re.compile(r"^vllm: |\bvllm[_-]ascend\b|/vllm/|\bvllm (?:serve|--)"),
        # vllm-25-oom (prefixes stripped): the V0 memory profiler's own wording
        re.compile(r"Memory profiling results: total_gpu_memory=|^# GPU blocks: \d+, # CPU blocks"),
        re.compile(r"\b(?:INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\]"),
    ),
)
