"""TabbyAPI's (ExLlamaV2/V3) log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from TabbyAPI's source (issue 33;
no fixture log exists): backends/exllamav2/model.py ("Loading model: ...", "Model successfully
loaded."), common/model.py (``load_model_gen``: "Using backend exllamav2", the
rich bar "Loading model modules" and its draft and vision twins, the backend checks) and
endpoints/server.py (``start_api``: the documentation and endpoint URLs, then uvicorn, whose
"Uvicorn running on" the shared vocabulary reads as ready). The model loads before the API
starts.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker, progress

_L, _I = Phase.LOADING, Phase.INITIALIZING

LOG_PROFILE: Final = LogProfile(
    markers=(
        # common/model.py load_model_gen ("Using backend exllamav2")
        marker(r"\bUsing backend exllamav\d\b", "weights_begin", _L),
        # backends/exllamav2/model.py load_model_sync ("Loading model: /models/Qwen2.5-exl2",
        # "Loading draft model: ...", "Loading with autosplit", "... tensor parallel")
        marker(
            r"\bLoading (?:draft )?model: \S"
            r"|\bLoading with (?:autosplit|tensor parallel|a manual GPU split)\b",
            "weights_begin",
            _L,
        ),
        # common/model.py: rich's bar, of modules, not files ("Loading model modules ━━━━━━
        # 100% 65/65 0:00:04")
        progress(
            r"\bLoading (?:model|draft|vision) modules\b[^0-9]*(?:\d+%\s*)?"
            r"(?P<done>\d+)/(?P<total>\d+)",
            "weights",
            _L,
            per_model=True,
        ),
        # backends/exllamav2/model.py load_gen: the weights are in and the generator is built
        marker(r"\bModel successfully loaded\.", "weights_end", _I),
        # endpoints/server.py start_api: printed after the load, before uvicorn binds
        marker(
            r"\bDeveloper documentation: https?://|\bChat completions: https?://", "http_up", _I
        ),
    ),
    fatal=(
        # common/model.py load_model_gen: a backend that is not installed or not known
        fatal(
            r"\bBackend '[^']*' selected, but required dependencies are not installed"
            r"|\bInvalid backend '[^']*'\. Available backends\b",
            FailureReason.CRASH,
        ),
    ),
    detect=(
        # its FastAPI title and config file, and its backend containers (backends/*/model.py)
        re.compile(
            r"\bTabbyAPI\b|\btabby_config\.yml\b|\bExllamaV[23]Container\b|Using backend exllamav\d"
        ),
    ),
)
