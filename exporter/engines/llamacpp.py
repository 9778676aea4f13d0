"""llama.cpp server's log profile, as data: markers, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it. Sources: ENGINES.md section 5 (llama.cpp)
and the fixtures in ``shared/fixtures/logs/llamacpp-*.log``.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # ENGINES.md llama.cpp: the socket is up *before* the load, so not ready
        marker(r"HTTP server is listening, hostname", "http_up"),
        # ENGINES.md llama.cpp ("main: loading model"); llamacpp-01-ready, llamacpp-03-oom;
        # newer builds' llamacpp-07-ready ("srv    load_model: loading model '...'")
        marker(
            r"main: loading model|load_tensors: loading model tensors|\bload_model: loading model",
            "weights_begin",
            _L,
        ),
        # llamacpp-01-ready ("load_tensors: offloaded 43/43 layers to GPU")
        marker(r"load_tensors: offload(?:ed|ing)", "weights", _L),
        # llamacpp-01-ready ("llama_context: constructing llama_context", KV buffers)
        marker(r"llama_context: constructing|llama_kv_cache\w*: ", "kv_cache", _I),
        marker(r"warming up the model", "warmup", _I),
        # ENGINES.md llama.cpp ("main: model loaded")
        marker(r"main: model loaded", "weights_end", _I),
        # ENGINES.md llama.cpp; llamacpp-01-ready ("main: server is listening on http://...")
        marker(
            r"main: server is listening on|starting the main loop|all slots are idle", "ready", _R
        ),
        # llamacpp-07-ready ("srv  llama_server: listening on http://127.0.0.1:52234")
        marker(r"\bllama_server: listening on\b", "ready", _R),
    ),
    fatal=(
        # llamacpp-03-oom ("alloc_tensor_range: failed to allocate CUDA0 buffer")
        fatal(r"failed to allocate \w+ buffer|unable to allocate \w+ buffer", FailureReason.OOM),
        # ENGINES.md llama.cpp ("main: exiting due to model loading error")
        fatal(
            r"error loading model|failed to load model|exiting due to model loading error",
            FailureReason.CRASH,
        ),
    ),
    detect=(
        re.compile(r"\bllama_model_load|\bllama_context:|\bload_tensors:|\bggml_\w+:|llama-server"),
        # llamacpp-07/09 ("0.00.174.927 E srv  llama_server: ..."): the timestamped entry point
        re.compile(r"^(?:[\d.]+ [IWEDT] )?(?:main: (?:loading model|model loaded)|srv +\w+: )"),
        re.compile(r"\bllama_server\b"),
    ),
)
