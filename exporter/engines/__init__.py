"""What differs per inference engine, as data: endpoints, readiness semantics, log profile.

Adding an engine is adding an ``Engine`` entry (and its log profile), not a code path.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

from exporter.engines.profile import LogProfile


class ReportKind(enum.StrEnum):
    """Where an engine reports on its own startup (``exporter.sources.engine_reports``)."""

    TRTLLM_SERVER_INFO = "trtllm_server_info"
    SGLANG_METRICS = "sglang_metrics"
    TRITON_INDEX = "triton_index"


@dataclass(frozen=True, slots=True)
class Engine:
    """One inference engine's defaults and behaviour during a cold start.

    Attributes:
        name: config and label value ("vllm").
        title: human name ("vLLM").
        health_path: readiness endpoint, answering 200 when ready.
        completion_path: OpenAI-compatible completion endpoint.
        listens_while_loading: the port answers (503) during the load, as llama.cpp does;
            the others refuse connections until ready (ENGINES.md section 3).
        log: markers, fatal patterns and benign noise of its logs.
        process_words: regex naming its server process on a command line; with the target's
            port it finds a server that does not listen yet (vLLM, SGLang and TGI refuse
            connections for the whole load).
        embeds: engines whose lines this one's log carries as well (Ollama runs llama.cpp,
            Triton runs vLLM or TensorRT-LLM backends): when both are recognised, this wins.
        sleep_path: endpoint that says whether a ready server sleeps (vLLM sleep mode,
            ENGINES.md section 8), asked after each good health probe; None: no sleep mode.
        report: where it reports on its own startup (ENGINES.md section 8), if anywhere.
    """

    name: str
    title: str
    health_path: str = "/health"
    completion_path: str = "/v1/completions"
    listens_while_loading: bool = False
    log: LogProfile = field(default_factory=LogProfile)
    process_words: str = ""
    embeds: tuple[str, ...] = ()
    sleep_path: str | None = None
    report: ReportKind | None = None


def _builtin() -> dict[str, Engine]:
    from exporter.engines import (
        aphrodite,
        dynamo,
        koboldcpp,
        lightllm,
        llamacpp,
        lmdeploy,
        localai,
        mindie,
        mistralrs,
        mlcllm,
        nim,
        ollama,
        openai,
        rayserve,
        sglang,
        tabbyapi,
        tei,
        tgi,
        triton,
        trtllm,
        vllm,
        xinference,
    )

    engines = [
        # First: its images name the engine it runs ("ai-dynamo/vllm-runtime"), and the first
        # engine whose words an image or command names is the pod's (discovery.pods).
        Engine(
            "dynamo",
            "NVIDIA Dynamo",
            listens_while_loading=True,
            log=dynamo.LOG_PROFILE,
            process_words=r"dynamo\.(?:frontend|vllm|sglang|trtllm)|dynamo-run|ai-dynamo/",
            embeds=("vllm", "sglang", "trtllm"),
        ),
        Engine(
            "sglang",
            "SGLang",
            log=sglang.LOG_PROFILE,
            process_words=r"sglang",
            report=ReportKind.SGLANG_METRICS,
        ),
        Engine(
            "vllm",
            "vLLM",
            log=vllm.LOG_PROFILE,
            process_words=r"vllm",
            sleep_path="/is_sleeping",
        ),
        Engine(
            "tgi",
            "Text Generation Inference",
            log=tgi.LOG_PROFILE,
            process_words=r"text-generation-launcher",
        ),
        Engine(
            "llamacpp",
            "llama.cpp server",
            listens_while_loading=True,
            log=llamacpp.LOG_PROFILE,
            process_words=r"llama-server|llama_cpp\.server",
        ),
        Engine(
            "trtllm",
            "TensorRT-LLM (trtllm-serve)",
            log=trtllm.LOG_PROFILE,
            process_words=r"trtllm-serve",
            report=ReportKind.TRTLLM_SERVER_INFO,
        ),
        Engine(
            "triton",
            "Triton Inference Server",
            health_path="/v2/health/ready",
            log=triton.LOG_PROFILE,
            process_words=r"tritonserver",
            embeds=("vllm", "trtllm"),
            report=ReportKind.TRITON_INDEX,
        ),
        Engine(
            "ollama",
            "Ollama",
            health_path="/api/version",
            listens_while_loading=True,
            log=ollama.LOG_PROFILE,
            process_words=r"ollama (?:serve|runner)",
            embeds=("llamacpp",),
        ),
        Engine(
            "lmdeploy",
            "LMDeploy",
            log=lmdeploy.LOG_PROFILE,
            process_words=r"lmdeploy",
        ),
        Engine(
            "mindie",
            "MindIE (Ascend)",
            log=mindie.LOG_PROFILE,
            process_words=r"mindieservice_daemon|mindie",
        ),
        Engine(
            "tei",
            "Text Embeddings Inference",
            log=tei.LOG_PROFILE,
            process_words=r"text-embeddings-router",
        ),
        Engine(
            "koboldcpp",
            "KoboldCpp",
            health_path="/api/v1/model",
            listens_while_loading=False,
            log=koboldcpp.LOG_PROFILE,
            process_words=r"koboldcpp",
            embeds=("llamacpp",),
        ),
        # Issue 33: profiles written from each engine's own source and docs. An engine that
        # runs another inside it (a serving framework over vLLM, a fork of it) embeds it, so
        # its own names win over the format or load lines they share.
        Engine(
            "mistralrs",
            "mistral.rs",
            log=mistralrs.LOG_PROFILE,
            process_words=r"mistralrs|mistral\.rs",
        ),
        # LocalAI's image checks its frontend at /readyz (scripts/build/healthcheck.sh)
        Engine(
            "localai",
            "LocalAI",
            health_path="/readyz",
            listens_while_loading=True,
            log=localai.LOG_PROFILE,
            process_words=r"local-ai|localai",
            embeds=("llamacpp", "vllm"),
        ),
        Engine(
            "tabbyapi",
            "TabbyAPI (ExLlamaV2/V3)",
            log=tabbyapi.LOG_PROFILE,
            process_words=r"tabby(?:api|API)",
        ),
        # MLC-LLM, Xinference and Ray Serve LLM: the OpenAI model list, served once a model is
        Engine(
            "mlcllm",
            "MLC-LLM (mlc_llm serve)",
            health_path="/v1/models",
            log=mlcllm.LOG_PROFILE,
            process_words=r"mlc_llm",
        ),
        Engine(
            "xinference",
            "Xinference",
            health_path="/v1/models",
            log=xinference.LOG_PROFILE,
            process_words=r"xinference",
            embeds=("vllm", "sglang", "llamacpp", "lmdeploy"),
        ),
        Engine(
            "rayserve",
            "Ray Serve LLM",
            health_path="/v1/models",
            listens_while_loading=True,
            log=rayserve.LOG_PROFILE,
            process_words=r"\bserve (?:run|deploy)\b|ray::Serve",
            embeds=("vllm",),
        ),
        # NIM's docs: /v1/health/ready answers 200 once the model serves, /v1/health/live before
        Engine(
            "nim",
            "NVIDIA NIM for LLMs",
            health_path="/v1/health/ready",
            log=nim.LOG_PROFILE,
            process_words=r"nim_llm|vllm_nvext|/nim/",
            embeds=("vllm", "trtllm"),
        ),
        Engine(
            "lightllm",
            "LightLLM",
            log=lightllm.LOG_PROFILE,
            process_words=r"lightllm",
            embeds=("vllm",),
        ),
        Engine(
            "aphrodite",
            "Aphrodite Engine",
            log=aphrodite.LOG_PROFILE,
            process_words=r"aphrodite",
            embeds=("vllm",),
        ),
        Engine("openai", "generic OpenAI-compatible server", log=openai.LOG_PROFILE),
    ]
    return {e.name: e for e in engines}


#: Every engine the exporter knows, by config name.
ENGINES: Final[dict[str, Engine]] = _builtin()
