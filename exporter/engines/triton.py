"""Triton Inference Server's log profile, as data: markers, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it. Source: ENGINES.md sections 3 and 5
(Triton); no fixture log exists for Triton yet.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # ENGINES.md Triton ("loading: %s:%d"), core model_lifecycle.cc
        marker(r"\bloading: \S+:\d+", "weights_begin", _L),
        # ENGINES.md Triton ("successfully loaded '%s'")
        marker(r"successfully loaded '", "weights_end", _I),
        # ENGINES.md Triton: services start after the models loaded (default mode)
        marker(r"Started Metrics Service at", "http_up", _I),
        marker(r"Started (?:HTTPService|GRPCInferenceService) at", "ready", _R),
    ),
    fatal=(
        # ENGINES.md Triton: a model that cannot load keeps the server from becoming ready
        fatal(r"failed to load '|failed to load all models", FailureReason.CRASH),
        fatal(r"error: creating server:", FailureReason.CRASH),
    ),
    detect=(
        re.compile(r"tritonserver|Triton Inference Server|TRITONBACKEND|model_lifecycle\.cc"),
        # triton-03-crash: glog lines naming the server's own sources ("server.cc:312]")
        re.compile(
            r"^[IWEF]\d{4} [\d:.]+\s+\d+ (?:server|grpc_server|http_server|backend_\w+)\.cc:\d+\]"
        ),
    ),
)
