"""The numbers a simulated engine's log lines quote, derived from its flags. Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from exporter_tooling.simulate.gpustate import (
    CUDA_GRAPH_BYTES,
    GIB,
    GPU_TOTAL_BYTES,
    KV_CACHE_BYTES,
    weights_on_gpu,
)
from exporter_tooling.simulate.plan import MIB, SimConfig
from exporter_tooling.simulate.script import mmss

#: 80 layers x 8 KV heads x 128 dims x K and V x 2 bytes: a 70B-class model with GQA.
KV_BYTES_PER_TOKEN: Final = 327_680


def log_numbers(cfg: SimConfig, directory: Path, first: Path, pid: int) -> dict[str, object]:
    """Numbers the log lines quote, derived from the flags so every run says the same."""
    weights = weights_on_gpu(cfg.weights_bytes) / GIB
    kv = KV_CACHE_BYTES / GIB
    graphs = CUDA_GRAPH_BYTES / GIB
    avail = GPU_TOTAL_BYTES / GIB - 0.55  # what is left after the CUDA context
    tokens = KV_CACHE_BYTES // KV_BYTES_PER_TOKEN
    graph_s = 0.45 * cfg.init_duration
    return {
        "model_path": str(directory),
        "model_file": str(first),
        "host": cfg.host,
        "port": cfg.port,
        "tp": cfg.gpus,
        "pid": pid,
        "warm_port": 40000 + pid % 20000,
        "free_mib": GPU_TOTAL_BYTES // MIB - 551,
        "avail_gb": avail,
        "weights_gib": weights,
        "weights_mib": weights * 1024,
        "avail_after_gb": avail - weights,
        "kv_gib": kv,
        "k_gib": kv / 2,
        "kv_mib": kv * 1024,
        "k_mib": kv * 512,
        "kv_tokens": tokens,
        "concurrency": tokens / 32768,
        "avail_kv_gb": avail - weights - kv,
        "graphs_gib": graphs,
        "avail_graph_gb": avail - weights - kv - graphs,
        "dynamo_s": 0.2 * cfg.init_duration,
        "compile_s": 0.05 * cfg.init_duration,
        "compile_total_s": 0.25 * cfg.init_duration,
        "graph_s": graph_s,
        "graph_mmss": mmss(graph_s),
        "graph_rate": 67 / max(graph_s, 0.01),
        "init_s": cfg.init_duration,
    }
