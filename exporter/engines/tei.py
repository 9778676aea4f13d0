"""Text Embeddings Inference's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from TEI's router source
(router/src/lib.rs, router/src/http/server.rs: "Warming up model", "Starting HTTP server",
"Ready") and its README's sample logs; no fixture log exists for TEI (issue 33).
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # backends/candle/src/lib.rs ("Starting FlashBert model on Cuda(...)")
        marker(r"text_embeddings_backend\w*: .*\bStarting \w+ model on\b", "weights_begin", _L),
        # router/src/lib.rs ("Warming up model")
        marker(r"text_embeddings_router\S*: .*\bWarming up model\b", "warmup", _I),
        # router/src/http/server.rs: the socket opens after the warm-up, then "Ready"
        marker(r"text_embeddings_router\S*: .*\bStarting (?:HTTP|gRPC) server\b", "http_up", _I),
        marker(r"text_embeddings_router\S*: \S+: Ready\s*$", "ready", _R),
    ),
    fatal=(
        # router/src/lib.rs returns anyhow errors ("Could not create backend", "Could not start
        # backend", "Model backend is not healthy") that main prints as "Error: ..."
        fatal(
            r"\bCould not (?:create|start) backend\b|\bModel backend is not healthy\b",
            FailureReason.CRASH,
        ),
    ),
    detect=(
        # the crates' tracing targets (router/src/main.rs "Args { model_id: ...")
        re.compile(r"\btext_embeddings_(?:router|backend|core)\w*|text-embeddings-router"),
    ),
)
