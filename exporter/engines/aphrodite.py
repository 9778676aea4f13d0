"""Aphrodite Engine's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Aphrodite is a fork of vLLM (issue 33; no
fixture log exists): its engine prints vLLM's load lines in vLLM's words and format
(aphrodite/common/logger.py), so it takes vLLM's profile (vllm.py), adds its own banner
(aphrodite/engine/aphrodite_engine.py: "Initializing the Aphrodite Engine (v0.6.0) with the
following config:") and is detected by its own name, never by the format it shares.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.engines import vllm
from exporter.engines.profile import LogProfile, marker

LOG_PROFILE: Final = LogProfile(
    markers=(
        # aphrodite/engine/aphrodite_engine.py ("Initializing the Aphrodite Engine (v0.6.0)")
        marker(r"\bInitializing the Aphrodite Engine\b", "engine_init"),
        *vllm.LOG_PROFILE.markers,
    ),
    fatal=vllm.LOG_PROFILE.fatal,
    benign=vllm.LOG_PROFILE.benign,
    wrappers=vllm.LOG_PROFILE.wrappers,
    detect=(
        # its name, its module paths and its package
        re.compile(
            r"\bAphrodite\b|\baphrodite_engine\.py\b|\baphrodite[./](?:engine|endpoints|common)\b|/aphrodite/"
        ),
    ),
)
