"""MLC-LLM's (``mlc_llm serve``) log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from MLC-LLM's source and docs
(issue 33; no fixture log exists): python/mlc_llm/support/logging.py's format
(``[2024-03-14 02:18:28] INFO auto_device.py:79: Found device: cuda:0``), the model library's
resolution ("Using library model: dist/libs/...so", chat_module.py, engine_base.py; jit.py
"Compiling using commands below", "Using cached model lib"), the memory plan (model_metadata.py,
cpp/serve/config.cc), TVM's errors, and uvicorn, whose "Uvicorn running on" the shared
vocabulary reads as ready.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

_L = Phase.LOADING

LOG_PROFILE: Final = LogProfile(
    markers=(
        # python/mlc_llm/support/auto_device.py ("Found device: cuda:0")
        marker(r"\bauto_device\.py:\d+: Found device: ", "engine_init"),
        # python/mlc_llm/interface/jit.py: the model library is compiled on first use
        marker(
            r"\bjit\.py:\d+: (?:Compiling using commands below|Using cached model lib)\b", "compile"
        ),
        # chat_module.py, serve/engine_base.py ("Using library model: ...-cuda.so")
        marker(r"\bUsing library model: ", "weights_begin", _L),
        # python/mlc_llm/cli/model_metadata.py ("Total memory usage: 1581.73 MB (Parameters:"),
        # cpp/serve/config.cc ('Under mode "local", max batch size will be set to 4, max KV
        # cache token capacity will be set to 8192'): the memory plan, made before the load
        marker(
            r"\bTotal memory usage: [\d.]+ ?[KMG]B \(Parameters: "
            r"|\bmax KV cache token capacity will be set to\b",
            "kv_cache",
        ),
    ),
    fatal=(
        # cpp/serve/config.cc's memory check ("Insufficient GPU memory error: The available
        # single GPU memory is ... MB, which is less than the sum of model weight size ...")
        fatal(r"\bInsufficient GPU memory error\b", FailureReason.OOM),
        # python/mlc_llm/interface/jit.py: no compiled model library and JIT turned off
        fatal(r"\bNo cached model lib found, and JIT is disabled\b", FailureReason.CRASH),
        # TVM's runtime errors (python/tvm/error.py: "tvm.error.InternalError: Check failed")
        fatal(
            r"\bTVMError\b|\btvm\.error\.\w+Error\b|\bInternalError: Check failed\b",
            FailureReason.CRASH,
        ),
    ),
    detect=(
        re.compile(r"\bmlc[_-](?:llm|chat)\b|\bmlc-chat-config\.json\b|\bMLC[- ]LLM\b"),
        # support/logging.py's format with MLC's own module names
        re.compile(
            r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (?:INFO|WARNING|ERROR) "
            r"(?:auto_device|engine_base|chat_module|jit|model_metadata|auto_config|auto_weight"
            r"|download_cache)\.py:\d+: "
        ),
        # its C++ engine's own log lines ("[11:30:59] .../cpp/serve/config.cc:798: Under mode")
        re.compile(r"\bcpp/serve/\w+\.cc:\d+: "),
    ),
)
