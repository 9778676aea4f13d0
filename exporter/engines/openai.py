"""Log profile of a generic OpenAI-compatible server, or of a log whose engine is unknown.

No code paths: ``exporter.core.classify`` applies it above the shared vocabulary. Not knowing the
engine should not mean knowing nothing (issue 13), so this profile is the union of every
engine profile's fatal lines and ready announcements; their benign noise stays with each
engine, as one engine's noise pattern may shadow another's failure.
"""

from __future__ import annotations

from typing import Final

from exporter.base.model import Phase
from exporter.engines import (
    dynamo,
    koboldcpp,
    lightllm,
    llamacpp,
    lmdeploy,
    localai,
    mindie,
    mistralrs,
    mlcllm,
    nim,
    ollama,
    rayserve,
    sglang,
    tabbyapi,
    tei,
    tgi,
    triton,
    trtllm,
    vllm,
    xinference,
)
from exporter.engines.profile import LogPattern, LogProfile, benign

_PROFILES: Final = (
    vllm.LOG_PROFILE,
    sglang.LOG_PROFILE,
    tgi.LOG_PROFILE,
    llamacpp.LOG_PROFILE,
    trtllm.LOG_PROFILE,
    triton.LOG_PROFILE,
    ollama.LOG_PROFILE,
    lmdeploy.LOG_PROFILE,
    mindie.LOG_PROFILE,
    tei.LOG_PROFILE,
    koboldcpp.LOG_PROFILE,
    # issue 33; aphrodite is vLLM's profile, and the hosts' own lines only are new
    mistralrs.LOG_PROFILE,
    localai.LOG_PROFILE,
    tabbyapi.LOG_PROFILE,
    mlcllm.LOG_PROFILE,
    xinference.LOG_PROFILE,
    rayserve.LOG_PROFILE,
    dynamo.LOG_PROFILE,
    nim.LOG_PROFILE,
    lightllm.LOG_PROFILE,
)


def _ready(profiles: tuple[LogProfile, ...]) -> tuple[LogPattern, ...]:
    return tuple(p for prof in profiles for p in prof.markers if p.phase is Phase.READY)


LOG_PROFILE: Final = LogProfile(
    markers=_ready(_PROFILES),
    fatal=tuple(p for prof in _PROFILES for p in prof.fatal),
    benign=(
        # tgi-01-hang, vllm ENGINES.md: heartbeats every engine prints while it waits
        benign(r"Waiting for (?:shard|creating a placement group|in-flight requests)"),
    ),
    wrappers=tuple(p for prof in _PROFILES for p in prof.wrappers),
)
