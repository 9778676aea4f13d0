"""KoboldCpp's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from koboldcpp.py's own prints
("Load Text Model OK: True", "Starting Kobold API on port", "Please connect to custom endpoint
at") and its docs; its llama.cpp loader lines come from the embedded llama.cpp profile. No
fixture log exists for KoboldCpp (issue 33).
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines import llamacpp
from exporter.engines.profile import LogProfile, fatal, loading_markers, marker

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # koboldcpp.py: the model load's verdict, printed before the HTTP server starts
        marker(r"^Load (?:Text |Image )?Model OK: True\b", "weights_end", _I),
        # koboldcpp.py: the server prints its endpoints, then the one to connect to
        marker(r"^Starting (?:Kobold|OpenAI Compatible) API on port\b", "http_up", _I),
        marker(r"^Please connect to custom endpoint at https?://", "ready", _R),
        # the embedded llama.cpp's loader lines (llamacpp.py), never its ready lines
        *loading_markers(llamacpp.LOG_PROFILE),
    ),
    fatal=(
        # koboldcpp.py: "Load Text Model OK: False" and then it exits
        fatal(r"^Load (?:Text |Image )?Model OK: False\b", FailureReason.CRASH),
        *llamacpp.LOG_PROFILE.fatal,
    ),
    detect=(
        # koboldcpp.py banners and endpoints ("Welcome to KoboldCpp - Version 1.80")
        re.compile(r"\bKoboldCpp\b|\bKobold (?:Lite|API)\b|Please connect to custom endpoint"),
    ),
)
