"""NVIDIA Dynamo's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from Dynamo's source and docs
(issue 33; no fixture log exists): the frontend's Rust ``tracing`` targets
(lib/llm/src/http/service/service_v2.rs: "Starting HTTP(S) service protocol=...", older
"Starting HTTP service on: 0.0.0.0:8000"; lib/llm/src/discovery/watcher.rs: "added model
model_name=..."), which the docs' multinode examples give as the sign the worker is loaded and
the frontend serves it. Dynamo needs etcd and NATS (its docs); its workers run vLLM, SGLang or
TensorRT-LLM, whose lines they print: detection is by Dynamo's own names.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines import trtllm, vllm
from exporter.engines.profile import LogProfile, fatal, loading_markers, marker

_R = Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # lib/llm/src/http/service/service_v2.rs: the frontend's port opens before any model
        marker(r"dynamo_llm::http::service\S*: Starting HTTP(?:\(S\))? service\b", "http_up"),
        # lib/llm/src/discovery/watcher.rs ("added model model_name=\"Qwen/Qwen3-0.6B\""): a
        # worker registered its model and the frontend routes to it (the docs' ready sign)
        marker(r"dynamo_llm::discovery::watcher\S*: added model\b", "ready", _R),
        # the engine under a Dynamo worker (vllm.py, trtllm.py), ready lines excepted: the
        # frontend says when the model serves
        *loading_markers(vllm.LOG_PROFILE, trtllm.LOG_PROFILE),
    ),
    fatal=(
        # docs: etcd (discovery) and NATS (the request plane) must be reachable; a runtime
        # that cannot reach them never registers a model
        fatal(
            r"\b(?:failed|unable) to connect to (?:etcd|NATS)\b"
            r"|\b(?:etcd|NATS)\b.{0,80}?\b(?:connection refused|failed to connect)\b",
            FailureReason.CRASH,
        ),
        *vllm.LOG_PROFILE.fatal,
        *trtllm.LOG_PROFILE.fatal,
    ),
    wrappers=vllm.LOG_PROFILE.wrappers,
    detect=(
        # Rust crates' tracing targets and the Python packages' logger names
        re.compile(
            r"\bdynamo_(?:runtime|llm|run)::|\bdynamo\.(?:frontend|vllm|sglang|trtllm|runtime"
            r"|planner)\b"
        ),
    ),
)
