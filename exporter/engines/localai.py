"""LocalAI's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from LocalAI's source (issue 33;
no fixture log exists): core/application/startup.go ("Starting LocalAI using 4 threads, with
models path: /models"), core/http/app.go (Fiber's OnListen hook: "LocalAI API is listening!
Please connect to the endpoint for API documentation. endpoint=http://0.0.0.0:8080") and
pkg/model/loader.go. LocalAI loads models on the first request that names one, so the listening
line is its ready line; its backends (llama.cpp, vLLM) run as gRPC children whose lines it
forwards.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

_L, _R = Phase.LOADING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # core/application/startup.go ("Starting LocalAI using 4 threads, with models path:")
        marker(r"\bStarting LocalAI using \d+ threads\b", "engine_init"),
        # pkg/model/loader.go (debug: "Loading model in memory from file: /models/x.gguf")
        marker(r"\bLoading model in memory from file\b", "weights_begin", _L),
        # core/http/app.go: Fiber's OnListen hook, after the models' configs are read
        marker(r"\bLocalAI API is listening\b", "ready", _R),
    ),
    fatal=(
        # pkg/model/loader.go ("failed to load model with internal loader: could not load
        # model: rpc error: ...") and main.go's exit ("Error running the application")
        fatal(
            r"\bfailed to load model with internal loader\b|\bError running the application\b",
            FailureReason.CRASH,
        ),
    ),
    detect=(
        # its own name in its banner and ready line, and the binary's
        re.compile(r"\bLocalAI\b|\blocal-ai\b"),
    ),
)
