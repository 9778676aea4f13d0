"""LMDeploy's log profile (``lmdeploy serve api_server``), as data: markers, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it above the shared vocabulary. The API server
loads the model before uvicorn starts, so uvicorn's lines mean ready (the shared vocabulary
says so). Sources: the fixture ``shared/fixtures/logs/lmdeploy-01-ready.log``.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, benign, fatal, marker

LOG_PROFILE: Final = LogProfile(
    markers=(
        # lmdeploy-01-ready: the TurboMind engine is built, uvicorn starts next
        marker(r"gemm_config\.in is not found|\bTurboMind\b.*\b(?:init|load)", "engine_init"),
        # lmdeploy-01-ready ("Application startup complete.", "Uvicorn running on")
        marker(r"Uvicorn running on|Application startup complete", "ready", Phase.READY),
    ),
    fatal=(
        # lmdeploy-01-ready header: the thread's failure ("No module named '_turbomind'")
        fatal(r"No module named '_?turbomind'", FailureReason.CRASH),
    ),
    benign=(
        # lmdeploy-01-ready ("[WARNING] gemm_config.in is not found; using default GEMM algo")
        benign(r"gemm_config\.in is not found"),
    ),
    detect=(re.compile(r"\blmdeploy\b|\bturbomind\b|gemm_config\.in", re.I),),
)
