"""Log profile of a generic OpenAI-compatible server, as data: only what every engine shares.

No code paths: ``exporter.core.classify`` applies it. Readiness of such a server comes from its
probe, never from a log line, so no marker here announces ``ready``.
"""

from __future__ import annotations

from typing import Final

from exporter.core.model import Phase
from exporter.engines.profile import COMMON_BENIGN, COMMON_FATAL, LogProfile, marker, progress

LOG_PROFILE: Final = LogProfile(
    markers=(
        # ENGINES.md vLLM/SGLang: the shard bar most PyTorch loaders share
        progress(
            r"Loading (?:safetensors )?checkpoint shards\s*:\s*\d+% Completed \| "
            r"(?P<done>\d+)/(?P<total>\d+)",
            "shards",
            Phase.LOADING,
            per_model=True,
        ),
        # ENGINES.md uvicorn: HTTP is up; whether it serves is the probe's call
        marker(r"Uvicorn running on|Application startup complete", "http_up"),
    ),
    fatal=COMMON_FATAL,
    benign=COMMON_BENIGN,
)
