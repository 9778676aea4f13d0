"""NVIDIA NIM for LLMs' log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from NIM's docs and its Python
package (issue 33; no fixture log exists): the banner ("NVIDIA Inference Microservice LLM NIM
Version 1.0.0"), the profile selection of vllm_nvext/hub/ngc_profile.py ("Detected 1
compatible profile(s).", "Could not find a profile that is currently runnable with the detected
hardware") and ngc_injector.py ("Valid profile: <sha> (vllm-bf16-tp1)", "Selected profile:"),
then its vLLM or TensorRT-LLM backend's lines and uvicorn's ready line. NIM reads as ready at
``/v1/health/ready`` (NIM's docs). It may log as JSON ({"level": ..., "message": ...}): the
patterns search the whole line.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason
from exporter.engines import trtllm, vllm
from exporter.engines.profile import LogProfile, fatal, loading_markers, marker

LOG_PROFILE: Final = LogProfile(
    markers=(
        # vllm_nvext/hub/ngc_profile.py ("Detected 1 compatible profile(s).")
        marker(r"\bDetected \d+ compatible profile\(s\)", "profile_select"),
        # vllm_nvext/hub/ngc_injector.py ("Valid profile: 8835c317... (vllm-bf16-tp1)")
        marker(r"\b(?:Valid|Selected) profile: [0-9a-f]{16,}", "profile_select"),
        # the backend's own load lines (vllm.py, trtllm.py), their ready lines excepted
        *loading_markers(vllm.LOG_PROFILE, trtllm.LOG_PROFILE),
    ),
    fatal=(
        # vllm_nvext/hub/ngc_profile.py: no profile fits the GPUs it found
        fatal(r"\bCould not find a profile that is currently runnable\b", FailureReason.CRASH),
        *vllm.LOG_PROFILE.fatal,
        *trtllm.LOG_PROFILE.fatal,
    ),
    wrappers=vllm.LOG_PROFILE.wrappers,
    detect=(
        # its banner, its package and its profile selection
        re.compile(
            r"\bNVIDIA Inference Microservice\b|\bNIM LLM\b|\bvllm_nvext\b|\bnim_llm\w*"
            r"|compatible profile\(s\)"
        ),
    ),
)
