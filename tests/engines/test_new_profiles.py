"""Profiles written from engines' own source and docs (issue 33): what they announce, and that
their detection cannot steal any corpus log from the engine it belongs to."""

from __future__ import annotations

import json

import pytest

from exporter.base.model import FailureReason, LogClass, Phase
from exporter.cli import main
from exporter.commands.replay_log import detect_engine, read_lines
from exporter.core.classify import LogClassifier, clean
from exporter.engines import ENGINES
from tests import corpus

NEW = (
    "tei",
    "koboldcpp",
    "mistralrs",
    "localai",
    "tabbyapi",
    "mlcllm",
    "xinference",
    "rayserve",
    "dynamo",
    "nim",
    "lightllm",
    "aphrodite",
)


def one(engine: str, line: str):
    (event,) = LogClassifier(ENGINES[engine].log).classify(line, at=0.0)
    return event


@pytest.mark.parametrize(
    ("engine", "line", "phase"),
    [
        (
            "tei",
            "2025-01-04T20:38:18.706787Z  INFO text_embeddings_backend_candle: "
            "backends/candle/src/lib.rs:292: Starting FlashBert model on Cuda(CudaDevice(1))",
            "loading",
        ),
        (
            "tei",
            "2025-01-04T20:38:31Z  INFO text_embeddings_router: router/src/lib.rs:248: "
            "Warming up model",
            "initializing",
        ),
        (
            "tei",
            "2025-01-04T20:38:32Z  INFO text_embeddings_router::http::server: "
            "router/src/http/server.rs:1813: Ready",
            "ready",
        ),
        ("koboldcpp", "Load Text Model OK: True", "initializing"),
        (
            "koboldcpp",
            "Starting Kobold API on port 5001 at http://localhost:5001/api/",
            "initializing",
        ),
        ("koboldcpp", "Please connect to custom endpoint at http://localhost:5001", "ready"),
        (
            "mistralrs",
            "2026-02-22T21:50:34.958359Z  INFO mistralrs_core::utils::varbuilder_utils: "
            "Loading model using mmap strategy.",
            "loading",
        ),
        (
            "mistralrs",
            "2026-02-22T21:55:58.532103Z  INFO mistralrs_core: Beginning dummy run.",
            "initializing",
        ),
        (
            "mistralrs",
            "2026-02-22T21:58:12.500000Z  INFO mistralrs_server: OpenAI-compatible server "
            "listening on http://0.0.0.0:1234.",
            "ready",
        ),
        (
            "localai",
            "1:38AM DBG Loading model in memory from file: /models/phi-2.Q8_0.gguf",
            "loading",
        ),
        (
            "localai",
            "1:38AM INF LocalAI API is listening! Please connect to the endpoint for API "
            "documentation. endpoint=http://0.0.0.0:8080",
            "ready",
        ),
        ("tabbyapi", "INFO:     Using backend exllamav2", "loading"),
        (
            "tabbyapi",
            "INFO:     Developer documentation: http://127.0.0.1:5000/redoc",
            "initializing",
        ),
        ("tabbyapi", "INFO:     Uvicorn running on http://127.0.0.1:5000", "ready"),
        (
            "mlcllm",
            "[2024-03-14 02:18:28] INFO engine_base.py:516: Using library model: "
            "dist/libs/Llama-3-8B-Instruct-q4f16_1-cuda.so",
            "loading",
        ),
        ("mlcllm", "INFO:     Uvicorn running on http://127.0.0.1:8000", "ready"),
        (
            "xinference",
            "2024-04-16 06:46:39,265 xinference   10148 INFO     Xinference successfully "
            "started. Endpoint: http://127.0.0.1:9997",
            "ready",
        ),
        (
            "rayserve",
            "(ServeController pid=4242) INFO 2025-01-01 00:00:00,000 controller 4242 "
            "deployment_state.py:1900 - Adding 1 replica to Deployment(name='LLMServer', "
            "app='default').",
            "loading",
        ),
        (
            "rayserve",
            "INFO 2025-01-01 00:05:00,000 serve 100 -- Application 'default' is ready at "
            "http://127.0.0.1:8000/.",
            "ready",
        ),
        (
            "rayserve",
            "INFO 2024-10-23 21:42:27,754 serve 32467 client.py:492 - Deployment 'echo:s8cys2ug' "
            "is ready at `http://127.0.0.1:8000/`. component=serve deployment=echo",
            "ready",
        ),
        (
            "dynamo",
            "2025-06-13T02:40:00.000Z  INFO dynamo_llm::http::service::service_v2: Starting "
            'HTTP service on: 0.0.0.0:8000 address="0.0.0.0:8000"',
            None,
        ),
        (
            "dynamo",
            "2025-06-13T02:46:35.040Z  INFO dynamo_llm::discovery::watcher: added model "
            'model_name="meta-llama/Llama-3.1-8B-Instruct"',
            "ready",
        ),
        (
            "nim",
            "INFO 08-20 21:46:27.898 ngc_injector.py:106] Valid profile: 8835c31752fbc67ef658b2"
            "0a9f78e056914fdef0660206d82f252d62fd96064d (vllm-bf16-tp1)",
            None,
        ),
        (
            "nim",
            "INFO 08-20 21:47:01 model_runner.py:1] Starting to load model "
            "meta/llama3-8b-instruct...",
            "loading",
        ),
        ("nim", "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)", "ready"),
        ("lightllm", "INFO 05-20 10:00:00 [api_start.py:300] http server pid 4242", "initializing"),
        ("lightllm", "INFO:     Application startup complete.", "ready"),
        (
            "aphrodite",
            "INFO 12-15 11:52:48 aphrodite_engine.py:73] Initializing the Aphrodite Engine "
            "with the following config:",
            None,
        ),
        ("aphrodite", "INFO:     Application startup complete.", "ready"),
    ],
)
def test_markers_announce_their_phase(engine, line, phase):
    event = one(engine, line)
    assert event.cls is LogClass.MARKER
    assert event.phase == (None if phase is None else Phase(phase))


@pytest.mark.parametrize(
    ("engine", "line"),
    [
        ("tei", "Error: Could not create backend"),
        ("koboldcpp", "Load Text Model OK: False"),
        ("koboldcpp", "llama_model_load: error loading model: failed to open model.gguf"),
        ("mistralrs", "OpenAI server error: Address already in use (os error 98)"),
        (
            "localai",
            '1:40AM ERR Server error error="failed to load model with internal loader: could '
            'not load model: rpc error: code = Unavailable desc = error reading from server: EOF"',
        ),
        (
            "tabbyapi",
            "ValueError: Backend 'exllamav3' selected, but required dependencies are not "
            "installed.",
        ),
        (
            "mlcllm",
            "tvm.error.InternalError: Check failed: (offset + needed_size <= size) is false",
        ),
        (
            "xinference",
            "2024-09-11 15:13:33,673 xinference.core.supervisor 81596 ERROR    Worker dead. "
            "address: 127.0.0.1:31285, influenced models: ['qwen2-instruct']",
        ),
        (
            "rayserve",
            "(ServeController pid=4242) ERROR 2025-01-01 00:10:00,000 controller 4242 "
            "deployment_state.py:2000 - The deployment failed to start 3 times in a row. This "
            "may be due to a problem with its constructor or initial health check failing.",
        ),
        (
            "dynamo",
            "2025-06-13T02:40:00.000Z ERROR dynamo_runtime::transports::etcd: Unable to connect "
            "to etcd server at http://localhost:2379",
        ),
        (
            "nim",
            "ValueError: Could not find a profile that is currently runnable with the detected "
            "hardware. Please check the system information below and make sure you have enough "
            "free GPUs.",
        ),
        ("lightllm", "ValueError: Not enough GPUs specified. You need at least 2, but got 1."),
        (
            "lightllm",
            "ERROR 05-20 10:01:00 [start_utils.py:33] init func start_detokenization_process : "
            "Traceback (most recent call last): ...",
        ),
        ("aphrodite", "RuntimeError: Engine core initialization failed. See root cause above."),
    ],
)
def test_their_failures_are_fatal(engine, line):
    event = one(engine, line)
    assert (event.cls, event.fatal_reason) == (LogClass.FATAL, FailureReason.CRASH)


@pytest.mark.parametrize(
    ("engine", "lines"),
    [
        (
            "aphrodite",
            [
                "INFO 12-15 11:52:48 aphrodite_engine.py:73] Initializing the Aphrodite Engine "
                "with the following config:",
                "INFO 12-15 11:53:20 model_runner.py:1] Loading model weights took 3.8 GB",
                "INFO 12-15 11:53:30 llm_engine.py:1] # GPU blocks: 3531, # CPU blocks: 327",
            ],
        ),
        (
            "lightllm",
            [
                "INFO 05-20 10:00:00 [api_start.py:258] all start args:StartArgs(run_mode="
                "'normal', model_dir='/models/llama', tp=2)",
                "INFO 05-20 10:01:00 [manager.py:98] use vllm-w8a8 kernels",
                "INFO 05-20 10:02:00 [api_start.py:60] http server pid 4242",
            ],
        ),
        (
            "xinference",
            [
                "2024-03-29 18:28:10,000 xinference.core.worker 75 DEBUG    Enter "
                "launch_builtin_model, args: ...",
                "INFO 03-29 18:28:50 llm_engine.py:357] # GPU blocks: 3531, # CPU blocks: 327",
                "INFO 03-29 18:28:51 llm_engine.py:357] Initializing an LLM engine (v0.3.3)",
            ],
        ),
        (
            "nim",
            [
                "NVIDIA Inference Microservice LLM NIM Version 1.0.0",
                "INFO 08-20 21:46:27 ngc_profile.py:219] Detected 1 compatible profile(s).",
                "INFO 08-20 21:47:01 llm_engine.py:1] Initializing an LLM engine (v0.4.1)",
                "INFO 08-20 21:47:09 model_runner.py:1] Loading model weights took 14.9 GB",
            ],
        ),
        (
            "rayserve",
            [
                "(ServeController pid=4242) INFO 2025-01-01 00:00:00,000 controller 4242 "
                "deployment_state.py:1 - Deploying new version of Deployment(name='LLMServer')",
                "(ServeReplica:default:LLMServer pid=4343) INFO 01-01 00:00:10 [core.py:1] "
                "Initializing a V1 LLM engine (v0.9.1)",
                "(ServeReplica:default:LLMServer pid=4343) INFO 01-01 00:00:20 [gpu_model_runner"
                ".py:1] Model loading took 14.99 GiB and 8.1 seconds",
            ],
        ),
        (
            "rayserve",
            [
                "INFO 2026-01-12 05:53:02,990 controller 1004 -- Adding 1 replica to Deployment("
                "name='LLMServer:qwen2_5-0_5b-instruct', app='llms').",
                "INFO 01-12 05:53:10 [core.py:1] Initializing a V1 LLM engine (v0.10.1)",
                "INFO 01-12 05:53:20 [gpu_model_runner.py:1] Model loading took 0.93 GiB",
            ],
        ),
        (
            "dynamo",
            [
                "2025-06-13T02:40:00.000Z  INFO dynamo_runtime::distributed: connected to etcd",
                "INFO 06-13 02:41:00 [core.py:1] Initializing a V1 LLM engine (v0.9.1)",
                "INFO 06-13 02:42:00 [gpu_model_runner.py:1] Model loading took 14.99 GiB",
            ],
        ),
    ],
)
def test_a_host_is_detected_by_its_own_names_over_the_engine_it_runs(engine, lines):
    # These print vLLM's lines (a fork, or a framework running vLLM inside): vLLM's format and
    # words match more lines, but the host's own names decide.
    assert detect_engine(lines) == engine


def test_a_koboldcpp_log_with_llamacpp_loader_lines_is_koboldcpp():
    lines = [
        "Welcome to KoboldCpp - Version 1.80",
        "llama_model_load: loaded meta data with 26 key-value pairs",
        "load_tensors: offloaded 33/33 layers to GPU",
        "Please connect to custom endpoint at http://localhost:5001",
    ]
    assert detect_engine(lines) == "koboldcpp"


def test_no_corpus_log_is_taken_by_a_new_profile():
    logs = corpus.require()
    for path in sorted(logs.glob("*.log")):
        lines = [clean(text) for _, text in read_lines(path)]
        for name in NEW:
            hits = [t for t in lines if any(d.search(t) for d in ENGINES[name].log.detect)]
            assert hits == [], (path.name, name, hits[:2])
        # every corpus log stays with the engine it came from (or with none)
        assert detect_engine(lines) in (path.name.split("-")[0], None), path.name


#: A start of each engine as its source words it (timestamps as its logger prints them),
#: and the phases ``replay-log --engine auto`` must find it passing through.
STARTS = {
    "mistralrs": (
        [
            "2026-02-22T21:50:34.876377Z  INFO mistralrs_core::pipeline::normal: Loading "
            "`tokenizer.json` at `Qwen/Qwen3-4B`",
            "2026-02-22T21:50:34.958359Z  INFO mistralrs_core::utils::varbuilder_utils: "
            "Loading model using mmap strategy.",
            "2026-02-22T21:55:58.532103Z  INFO mistralrs_core: Beginning dummy run.",
            "2026-02-22T21:58:12.443640Z  INFO mistralrs_core: Dummy run completed in 133.9s.",
            "2026-02-22T21:58:12.500000Z  INFO mistralrs_server: OpenAI-compatible server "
            "listening on http://0.0.0.0:1234.",
        ],
        ["starting", "loading", "initializing", "ready"],
    ),
    "localai": (
        [
            "1:38AM INF Starting LocalAI using 4 threads, with models path: /models",
            "1:38AM INF LocalAI version: v2.20.1 (7a2fb37fdb0f07a7cb4a32d0bf4d1e1d0c1b1b1b)",
            "1:38AM INF LocalAI API is listening! Please connect to the endpoint for API "
            "documentation. endpoint=http://0.0.0.0:8080",
        ],
        ["starting", "ready"],
    ),
    "tabbyapi": (
        [
            "INFO:     Using backend exllamav2",
            "INFO:     Loading model: /models/Qwen2.5-7B-Instruct-exl2",
            "INFO:     Loading with autosplit",
            "INFO:     Loading model modules ━━━━━━━━━━━━━━━━━━ 100% 65/65 0:00:04",
            "INFO:     Model successfully loaded.",
            "INFO:     Developer documentation: http://127.0.0.1:5000/redoc",
            "INFO:     Chat completions: http://127.0.0.1:5000/v1/chat/completions",
            "INFO:     Uvicorn running on http://127.0.0.1:5000 (Press CTRL+C to quit)",
        ],
        ["loading", "initializing", "ready"],
    ),
    "mlcllm": (
        [
            "[2024-05-05 02:50:13] INFO auto_device.py:79: Found device: cuda:0",
            "[2024-05-05 02:50:19] INFO jit.py:158: Using cached model lib: /root/.cache/"
            "mlc_llm/model_lib/d7c5d287.so",
            "[2024-05-05 02:50:20] INFO engine_base.py:142: Using library model: "
            "/data/mlc-llm/dist/libs/Meta-Llama-3-8B-Instruct-MLC-q4f16_1-cuda.so",
            "[2024-05-05 02:50:40] INFO:     Uvicorn running on http://127.0.0.1:8000",
        ],
        ["starting", "loading", "ready"],
    ),
    "xinference": (
        [
            "2024-02-27 17:17:29,313 xinference.core.supervisor 1504 INFO     Xinference "
            "supervisor 0.0.0.0:14154 started",
            "2024-02-27 17:17:33,903 xinference.core.worker 1504 INFO     Metrics server is "
            "started at: http://0.0.0.0:34531",
            "2024-02-27 17:17:35,265 xinference.api.restful_api 1500 INFO     Starting "
            "Xinference at endpoint: http://0.0.0.0:9997",
            "2024-02-27 17:17:36,265 xinference   1500 INFO     Xinference successfully "
            "started. Endpoint: http://0.0.0.0:9997",
        ],
        ["starting", "ready"],
    ),
    "rayserve": (
        [
            "INFO 2026-01-12 05:53:02,884 controller 1004 -- Deploying new version of "
            "Deployment(name='LLMServer:qwen', app='llms') (initial target replicas: 1).",
            "INFO 2026-01-12 05:53:02,990 controller 1004 -- Adding 1 replica to Deployment("
            "name='LLMServer:qwen', app='llms').",
            "(ServeReplica:llms:LLMServer:qwen pid=2056) INFO 01-12 05:53:40 [default_loader.py"
            ":1] Loading weights took 2.10 seconds",
            "INFO 2026-01-12 05:54:10,000 serve 1004 -- Application 'llms' is ready at "
            "http://0.0.0.0:8000/.",
        ],
        ["starting", "loading", "initializing", "ready"],
    ),
    "dynamo": (
        [
            "2025-06-13T02:40:00.000Z  INFO dynamo_llm::http::service::service_v2: Starting "
            'HTTP(S) service protocol="HTTP" address="0.0.0.0:8000"',
            "2025-06-13T02:40:01.000Z  INFO dynamo_llm::http::service::service_v2: chat "
            "endpoints enabled",
            "2025-06-13T02:46:35.040Z  INFO dynamo_llm::discovery::watcher: added model "
            'model_name="meta-llama/Llama-3.1-8B-Instruct"',
        ],
        ["starting", "ready"],
    ),
    "nim": (
        [
            "NVIDIA Inference Microservice LLM NIM Version 1.0.0",
            "INFO 06-23 15:41:21.19 ngc_profile.py:222] Detected 0 compatible profile(s).",
            "ERROR 06-23 15:41:21.19 utils.py:21] Could not find a profile that is currently "
            "runnable with the detected hardware. Please check the system information below "
            "and make sure you have enough free GPUs.",
        ],
        ["starting", "failed"],
    ),
    "lightllm": (
        [
            "INFO 05-20 10:00:00 [api_start.py:258] all start args:StartArgs(run_mode='normal',"
            " model_dir='/models/llama', tp=2)",
            "INFO 05-20 10:01:50 [start_utils.py:37] init func start_router_process : init ok",
            "INFO 05-20 10:02:00 [api_start.py:60] http server pid 4242",
            "INFO:     Application startup complete.",
        ],
        ["starting", "initializing", "ready"],
    ),
    "aphrodite": (
        [
            "INFO 12-15 11:52:48 aphrodite_engine.py:73] Initializing the Aphrodite Engine "
            "with the following config:",
            "INFO 12-15 11:53:02 model_runner.py:1] Loading model weights took 3.87 GB",
            "INFO:     Application startup complete.",
        ],
        ["starting", "initializing", "ready"],
    ),
}


@pytest.mark.parametrize("engine", sorted(STARTS))
def test_replay_log_recognises_each_start_and_its_phases(engine, tmp_path, capsys):
    lines, phases = STARTS[engine]
    log = tmp_path / f"{engine}.log"
    log.write_text("\n".join(lines) + "\n")
    assert main(["replay-log", "--engine", "auto", "--json", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["engine"], doc["engine_source"]) == (engine, "detected")
    assert [p["phase"] for p in doc["phases"]] == phases
    if phases[-1] == "failed":
        assert doc["reason"] == "crash" and "Could not find a profile" in doc["reason_detail"]
