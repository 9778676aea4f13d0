"""What each simulated engine says while it cold-starts: log lines as data, in the real formats.

Formats follow shared/ENGINES.md section 5 and the fixtures in shared/fixtures/logs
(vllm-06-ready, sglang-04-ready, llamacpp-01-ready, sglang-03-oom). Pure: the caller passes time.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from exporter_tooling.simulate.plan import SimEngine


class Scope(enum.StrEnum):
    """Who prints a line, which decides its prefix."""

    MAIN = "main"  # the launcher: "[2026-04-14 16:08:50] ..." (SGLang), "INFO 04-14 ..." (vLLM)
    RANKS = "ranks"  # every TP rank: "[2026-04-14 16:08:50 TP3] ..." (SGLang)
    RANK0 = "rank0"  # TP rank 0 only
    RAW = "raw"  # printed as is: tqdm bars, uvicorn, tracebacks, llama.cpp


class Effect(enum.StrEnum):
    """What happens, besides the lines, when a step is reached."""

    BIND = "bind"  # vLLM binds its port early and listens only when ready
    LISTEN = "listen"  # llama.cpp listens before it loads
    SPAWN = "spawn"  # worker processes start (distributed init)
    KV_CACHE = "kv_cache"  # KV cache pool allocated on every GPU
    GRAPHS = "graphs"  # CUDA graph capture: GPU memory up, GPU busy
    WARMUP = "warmup"  # warm-up run: GPU busiest


@dataclass(frozen=True, slots=True)
class Say:
    """One log line template (``str.format`` fields from the simulator's context).

    Attributes:
        text: the message.
        where: vLLM's ``[file.py:line]`` source location.
        level: vLLM's level word.
        scope: who prints it.
    """

    text: str
    where: str = ""
    level: str = "INFO"
    scope: Scope = Scope.MAIN


def raw(*texts: str) -> tuple[Say, ...]:
    """Lines printed exactly as written (after field substitution)."""
    return tuple(Say(t, scope=Scope.RAW) for t in texts)


def ranks(*texts: str) -> tuple[Say, ...]:
    """Lines printed once per tensor-parallel rank."""
    return tuple(Say(t, scope=Scope.RANKS) for t in texts)


@dataclass(frozen=True, slots=True)
class Step:
    """Lines said at a fraction ``at`` (0-1) of a phase, with an optional effect."""

    at: float
    says: tuple[Say, ...] = ()
    effect: Effect | None = None


@dataclass(frozen=True, slots=True)
class EngineScript:
    """Everything one engine says from launch to ready, and when it fails.

    Attributes:
        starting: steps over ``--start-seconds``.
        load_begin: said when weights start flowing.
        shard_bar: tqdm shard-bar template; empty means llama.cpp's progress dots.
        load_end: said when every shard is read.
        initializing: steps over ``--init-seconds``.
        listen: said just before the HTTP socket starts listening (when it was not already).
        warmup_seconds: after listening, health answers 503 this long (SGLang's warm-up).
        ready: said when health turns 200.
        access: access-log line for each request; empty means none.
        access_health: whether health requests get an access line (llama.cpp skips them).
        crash: a crash while loading weights.
        oom: a CUDA OOM where CUDA graphs would be captured.
        worker_died: a worker process vanished.
        fall_asleep: put to sleep (vLLM sleep mode); empty: the engine has none.
        wake_up: woken again.
    """

    starting: tuple[Step, ...]
    load_begin: tuple[Say, ...]
    shard_bar: str
    load_end: tuple[Say, ...]
    initializing: tuple[Step, ...]
    listen: tuple[Say, ...]
    warmup_seconds: float
    ready: tuple[Say, ...]
    access: Say | None
    access_health: bool
    crash: tuple[Say, ...]
    oom: tuple[Say, ...]
    worker_died: tuple[Say, ...]
    fall_asleep: tuple[Say, ...] = ()
    wake_up: tuple[Say, ...] = ()


def render(
    engine: SimEngine, say: Say, ctx: Mapping[str, object], now: float, tp: int
) -> list[str]:
    """The physical lines ``say`` becomes for ``engine`` at wall time ``now`` with ``tp`` ranks."""
    text = say.text.format_map(ctx)
    if say.scope is Scope.RAW or engine is SimEngine.LLAMACPP:
        return [text]
    local = time.localtime(now)
    if engine is SimEngine.VLLM:
        return [f"{say.level} {time.strftime('%m-%d %H:%M:%S', local)} [{say.where}] {text}"]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", local)
    if say.scope is Scope.MAIN:
        return [f"[{stamp}] {text}"]
    count = tp if say.scope is Scope.RANKS else 1
    return [f"[{stamp} TP{rank}] {text}" for rank in range(count)]


def mmss(seconds: float) -> str:
    """Seconds as tqdm prints them: ``MM:SS``."""
    whole = int(seconds)
    return f"{whole // 60:02d}:{whole % 60:02d}"


def shard_bar(template: str, done: int, total: int, elapsed: float) -> str:
    """A tqdm shard-bar line as vLLM and SGLang print it (bar_format ``{percentage:3.0f}%``)."""
    if done == 0 or elapsed <= 0:
        timing = "00:00<?, ?it/s"
    else:
        rate = done / elapsed
        speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
        timing = f"{mmss(elapsed)}<{mmss((total - done) / rate)}, {speed}"
    return template.format(pct=100 * done / total, n=done, total=total, timing=timing)


#: torch.distributed's line while a rank waits in c10d's store-based barrier for the others
#: (every engine that initialises torch.distributed prints it the same way).
BARRIER: Final = Say(
    "Waiting in store based barrier to initialize process group for rank: 0, key: "
    "store_based_barrier_key:1 (world_size=2, num_workers_joined=1, timeout=0:30:00)",
    "distributed_c10d.py:4373",
)
_SHARD_BAR: Final = (
    "Loading safetensors checkpoint shards: {pct:3.0f}% Completed | {n}/{total} [{timing}]"
)
_OOM: Final = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process "
    "has 78.06 GiB memory in use. Of the allocated memory 75.90 GiB is allocated by PyTorch, and "
    "1.48 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html"
    "#environment-variables)"
)
_SAFETENSORS_ERROR: Final = (
    "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"
)
_VLLM_PKG: Final = "/usr/local/lib/python3.12/dist-packages/vllm"
_SGL_PKG: Final = "/sgl-workspace/sglang/python/sglang/srt"


def _vllm_failure(frames: tuple[str, ...], error: str) -> tuple[Say, ...]:
    # The EngineCore process logs the root cause; the API server then raises the wrapper.
    head = Say("EngineCore failed to start.", "core.py:708", "ERROR")
    core = (
        "Traceback (most recent call last):",
        f'  File "{_VLLM_PKG}/v1/engine/core.py", line 699, in run_engine_core',
        "    engine_core = EngineCoreProc(*args, **kwargs)",
        *frames,
        error,
    )
    api = (
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/vllm", line 10, in <module>',
        "    sys.exit(main())",
        f'  File "{_VLLM_PKG}/v1/engine/utils.py", line 781, in wait_for_engine_startup',
        '    raise RuntimeError("Engine core initialization failed. "',
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {{}}",
    )
    return (head, *raw(*core), *raw(*api))


def _sglang_failure(frames: tuple[str, ...], error: str) -> tuple[Say, ...]:
    head = Say("Scheduler hit an exception: Traceback (most recent call last):", scope=Scope.RANK0)
    body = (
        f'  File "{_SGL_PKG}/managers/scheduler.py", line 2937, in run_scheduler_process',
        "    scheduler = Scheduler(",
        *frames,
        error,
        "",
    )
    tail = Say("Received sigquit from a child process. It usually means the child failed.")
    return (head, *raw(*body), tail)


def _loader_frames(package: str) -> tuple[str, ...]:
    return (
        f'  File "{package}/model_loader/weight_utils.py", line 537, '
        "in safetensors_weights_iterator",
        '    with safe_open(st_file, framework="pt") as f:',
    )


VLLM: Final = EngineScript(
    starting=(
        Step(0.0, (Say("Automatically detected platform cuda.", "__init__.py:241"),), Effect.BIND),
        Step(
            0.05,
            (
                Say("vLLM API server version 0.11.0", "api_server.py:1839"),
                Say(
                    "non-default args: {{'model_tag': '{model_path}', 'host': '{host}', "
                    "'port': {port}, 'tensor_parallel_size': {tp}}}",
                    "utils.py:233",
                ),
            ),
        ),
        Step(
            0.3,
            (
                Say(
                    "Initializing a V1 LLM engine (v0.11.0) with config: model='{model_path}', "
                    "tokenizer='{model_path}', dtype=torch.bfloat16, max_seq_len=32768, "
                    "tensor_parallel_size={tp}, pipeline_parallel_size=1, quantization=None, "
                    "enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0",
                    "core.py:77",
                ),
            ),
            Effect.SPAWN,
        ),
        Step(
            0.7,
            (
                Say(
                    "rank 0 in world size {tp} is assigned as DP rank 0, PP rank 0, TP rank 0",
                    "parallel_state.py:1208",
                ),
                Say("Using Flash Attention backend on V1 engine.", "cuda.py:362"),
            ),
        ),
    ),
    load_begin=(Say("Starting to load model {model_path}...", "gpu_model_runner.py:2602"),),
    shard_bar=_SHARD_BAR,
    load_end=(
        *raw("{final_bar}", ""),
        Say("Loading weights took {load_s:.2f} seconds", "default_loader.py:267"),
        Say(
            "Model loading took {weights_gib:.4f} GiB and {load_total_s:.6f} seconds",
            "gpu_model_runner.py:2653",
        ),
    ),
    initializing=(
        Step(
            0.0,
            (
                Say(
                    "Using cache directory: /root/.cache/vllm/torch_compile_cache/3f2a9c41d0/"
                    "rank_0_0/backbone for vLLM's torch.compile",
                    "backends.py:548",
                ),
                Say("Dynamo bytecode transform time: {dynamo_s:.2f} s", "backends.py:559"),
            ),
        ),
        Step(
            0.25,
            (
                Say(
                    "Compiling a graph for compile range (1, 8192) takes {compile_s:.2f} s",
                    "backends.py:197",
                ),
                Say("torch.compile took {compile_total_s:.2f} s in total", "monitor.py:34"),
            ),
        ),
        Step(
            0.35,
            (
                Say("Available KV cache memory: {kv_gib:.2f} GiB", "gpu_worker.py:298"),
                Say("GPU KV cache size: {kv_tokens:,} tokens", "kv_cache_utils.py:1087"),
                Say(
                    "Maximum concurrency for 32,768 tokens per request: {concurrency:.2f}x",
                    "kv_cache_utils.py:1091",
                ),
            ),
            Effect.KV_CACHE,
        ),
        Step(
            0.4,
            raw(
                "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          "
                "| 0/67 [00:00<?, ?it/s]"
            ),
            Effect.GRAPHS,
        ),
        Step(
            0.85,
            (
                *raw(
                    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| "
                    "67/67 [{graph_mmss}<00:00, {graph_rate:5.2f}it/s]"
                ),
                Say(
                    "Graph capturing finished in {graph_s:.0f} secs, took {graphs_gib:.2f} GiB",
                    "gpu_model_runner.py:3480",
                ),
            ),
            Effect.WARMUP,
        ),
        Step(
            1.0,
            (
                Say(
                    "init engine (profile, create kv cache, warmup model) took "
                    "{init_s:.2f} seconds",
                    "core.py:210",
                ),
            ),
        ),
    ),
    listen=(
        Say("Starting vLLM API server 0 on http://{host}:{port}", "launcher.py:34"),
        Say("Available routes are:", "launcher.py:42"),
        Say("Route: /health, Methods: GET", "launcher.py:46"),
        Say("Route: /v1/models, Methods: GET", "launcher.py:46"),
        Say("Route: /v1/completions, Methods: POST", "launcher.py:46"),
        *raw(
            "INFO:     Started server process [{pid}]",
            "INFO:     Waiting for application startup.",
            "INFO:     Application startup complete.",
        ),
    ),
    warmup_seconds=0.0,
    ready=(),
    access=Say(
        'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {reason}', scope=Scope.RAW
    ),
    access_health=True,
    crash=_vllm_failure(
        (
            f'  File "{_VLLM_PKG}/model_executor/model_loader/default_loader.py", line 265, '
            "in load_weights",
            "    loaded_weights = model.load_weights(self.get_all_weights(model_config, model))",
            *_loader_frames(_VLLM_PKG),
        ),
        _SAFETENSORS_ERROR,
    ),
    oom=_vllm_failure(
        (
            f'  File "{_VLLM_PKG}/v1/worker/gpu_model_runner.py", line 3420, in capture_model',
            "    self._capture_cudagraphs(compilation_cases, cudagraph_runtime_mode)",
        ),
        _OOM,
    ),
    worker_died=(
        Say(
            "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
            "core_client.py:564",
            "ERROR",
        ),
    ),
    # vLLM's sleep mode (vllm/v1/worker/gpu_worker.py, vllm/v1/executor/abstract.py).
    fall_asleep=(
        Say(
            "Sleep mode freed {freed_gib:.2f} GiB memory, 0.83 GiB memory is still in use.",
            "gpu_worker.py:117",
        ),
        Say("It took {sleep_s:.6f} seconds to fall asleep.", "abstract.py:290"),
    ),
    wake_up=(
        Say(
            "It took {wake_s:.6f} seconds to wake up tags ['weights', 'kv_cache'].",
            "abstract.py:309",
        ),
    ),
)


SGLANG: Final = EngineScript(
    starting=(
        Step(
            0.0,
            (
                Say(
                    "server_args=ServerArgs(model_path='{model_path}', "
                    "tokenizer_path='{model_path}', "
                    "load_format='auto', dtype='auto', host='{host}', port={port}, "
                    "mem_fraction_static=0.88, tp_size={tp}, random_seed=42, log_level='info', "
                    "enable_metrics=True)"
                ),
            ),
        ),
        Step(0.3, ranks("Init torch distributed begin."), Effect.SPAWN),
        Step(
            0.7,
            ranks("sglang is using nccl==2.27.3", "Init torch distributed ends. mem usage=0.00 GB"),
        ),
    ),
    load_begin=ranks("Load weight begin. avail mem={avail_gb:.2f} GB"),
    shard_bar=_SHARD_BAR,
    load_end=(
        *raw("{final_bar}", ""),
        *ranks(
            "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
            "avail mem={avail_after_gb:.2f} GB, mem usage={weights_gib:.2f} GB."
        ),
    ),
    initializing=(
        Step(
            0.1,
            ranks(
                "KV Cache is allocated. #tokens: {kv_tokens}, K size: {k_gib:.2f} GB, "
                "V size: {k_gib:.2f} GB",
                "Memory pool end. avail mem={avail_kv_gb:.2f} GB",
            ),
            Effect.KV_CACHE,
        ),
        Step(
            0.2,
            (
                *ranks(
                    "Capture cuda graph begin. This can take up to several minutes. "
                    "avail mem={avail_kv_gb:.2f} GB"
                ),
                *raw(
                    "Capturing batches (bs=256 avail_mem={avail_kv_gb:.2f} GB):   0%|          "
                    "| 0/67 [00:00<?, ?it/s]"
                ),
            ),
            Effect.GRAPHS,
        ),
        Step(
            0.85,
            (
                *raw(
                    "Capturing batches (bs=1 avail_mem={avail_graph_gb:.2f} GB): 100%|##########| "
                    "67/67 [{graph_mmss}<00:00, {graph_rate:5.2f}it/s]"
                ),
                *ranks(
                    "Capture cuda graph end. Time elapsed: {graph_s:.2f} s. mem usage="
                    "{graphs_gib:.2f} GB. avail mem={avail_graph_gb:.2f} GB."
                ),
            ),
        ),
        Step(
            0.95,
            ranks(
                "max_total_num_tokens={kv_tokens}, chunked_prefill_size=8192, "
                "max_prefill_tokens=16384, max_running_requests=4096, context_len=131072, "
                "available_gpu_mem={avail_graph_gb:.2f} GB"
            ),
        ),
    ),
    listen=(
        Say("INFO:     Started server process [{pid}]"),
        Say("INFO:     Waiting for application startup."),
        Say("INFO:     Application startup complete."),
        Say("INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"),
        Say('INFO:     127.0.0.1:{warm_port} - "GET /get_model_info HTTP/1.1" 200 OK'),
        Say(
            "Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0, ",
            scope=Scope.RANK0,
        ),
    ),
    warmup_seconds=1.0,
    ready=(
        Say('INFO:     127.0.0.1:{warm_port} - "POST /generate HTTP/1.1" 200 OK'),
        Say("The server is fired up and ready to roll!"),
    ),
    access=Say('INFO:     {client} - "{method} {path} HTTP/1.1" {status} {reason}'),
    access_health=True,
    crash=_sglang_failure(
        (
            f'  File "{_SGL_PKG}/model_executor/model_runner.py", line 735, in load_model',
            "    self.model = get_model(",
            *_loader_frames(_SGL_PKG),
        ),
        _SAFETENSORS_ERROR,
    ),
    oom=_sglang_failure(
        (
            f'  File "{_SGL_PKG}/model_executor/cuda_graph_runner.py", line 412, in capture',
            "    ) = self.capture_one_batch_size(bs, forward)",
        ),
        _OOM,
    ),
    worker_died=(
        Say("Rank 0 scheduler is dead. Please check if there are relevant logs."),
        Say("Received sigquit from a child process. It usually means the child failed."),
    ),
)


_LLAMA_GIVES_UP: Final = raw(
    "common_init_from_params: failed to create context with model '{model_file}'",
    "srv    load_model: failed to load model, '{model_file}'",
    "srv    operator(): operator(): cleaning up before exit...",
    "main: exiting due to model loading error",
)

LLAMACPP: Final = EngineScript(
    starting=(
        Step(
            0.0,
            raw(
                "build: 6940 (c5023daf6) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu",
                "system_info: n_threads = 8 (n_threads_batch = 8) / 16 | CUDA : ARCHS = 900 | "
                "USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | AVX2 = 1 | ",
                "init: using 15 threads for HTTP server",
                "start: binding port with default address family",
                "main: HTTP server is listening, hostname: {host}, port: {port}, http threads: 15",
                "main: loading model",
                "srv    load_model: loading model '{model_file}'",
            ),
            Effect.LISTEN,
        ),
        Step(
            0.3,
            raw(
                "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H100 80GB HBM3) - "
                "{free_mib} MiB free"
            ),
            Effect.SPAWN,
        ),
        Step(
            0.6,
            raw(
                "llama_model_loader: loaded meta data with 36 key-value pairs and 291 tensors from "
                "{model_file} (version GGUF V3 (latest))",
                "print_info: file format = GGUF V3 (latest)",
                "print_info: file type   = Q8_0",
                "print_info: file size   = {weights_gib:.2f} GiB (8.50 BPW) ",
            ),
        ),
    ),
    load_begin=raw(
        "load_tensors: loading model tensors, this can take a while... "
        "(mmap = false, direct_io = true)",
        "load_tensors: offloading 79 repeating layers to GPU",
        "load_tensors: offloaded 81/81 layers to GPU",
        "load_tensors:        CUDA0 model buffer size = {weights_mib:.2f} MiB",
    ),
    shard_bar="",
    load_end=raw(
        "llama_context: constructing llama_context",
        "llama_context: n_ctx         = 16384",
        "llama_context: n_batch       = 2048",
    ),
    initializing=(
        Step(
            0.1,
            raw(
                "llama_kv_cache:      CUDA0 KV buffer size = {kv_mib:.2f} MiB",
                "llama_kv_cache: size = {kv_mib:.2f} MiB ( 16384 cells,  80 layers,  4/4 seqs), "
                "K (f16): {k_mib:.2f} MiB, V (f16): {k_mib:.2f} MiB",
            ),
            Effect.KV_CACHE,
        ),
        Step(
            0.3,
            raw(
                "llama_context:      CUDA0 compute buffer size =   517.50 MiB",
                "llama_context: graph nodes  = 2566",
                "common_init_from_params: warming up the model with an empty run - please wait "
                "... (--no-warmup to disable)",
            ),
            Effect.GRAPHS,
        ),
        Step(0.6, (), Effect.WARMUP),
        Step(
            0.9,
            raw(
                "srv    load_model: initializing slots, n_slots = 4",
                "slot   load_model: id  0 | task -1 | new slot, n_ctx = 4096",
            ),
        ),
    ),
    listen=(),
    warmup_seconds=0.0,
    ready=raw(
        "main: model loaded",
        "main: server is listening on http://{host}:{port} - starting the main loop",
        "srv  update_slots: all slots are idle",
    ),
    access=Say("srv  log_server_r: request: {method} {path} {client_ip} {status}", scope=Scope.RAW),
    access_health=False,
    crash=(
        *raw(
            "llama_model_load: error loading model: tensor 'blk.16.ffn_down.weight' data is not "
            "within the file bounds, model is corrupted or incomplete",
            "llama_model_load_from_file_impl: failed to load model",
        ),
        *_LLAMA_GIVES_UP,
    ),
    oom=(
        *raw(
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8704.00 MiB on device 0: "
            "cudaMalloc failed: out of memory",
            "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 9126805504",
            "graph_reserve: failed to allocate compute buffers",
            "llama_init_from_model: failed to initialize the context: failed to allocate compute "
            "pp buffers",
        ),
        *_LLAMA_GIVES_UP,
    ),
    worker_died=raw("srv    operator(): operator(): cleaning up before exit..."),
)

SCRIPTS: Final[dict[SimEngine, EngineScript]] = {
    SimEngine.VLLM: VLLM,
    SimEngine.SGLANG: SGLANG,
    SimEngine.LLAMACPP: LLAMACPP,
}
