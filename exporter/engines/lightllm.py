"""LightLLM's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from LightLLM's source (issue 33;
no fixture log exists): lightllm/server/api_start.py (``normal_or_p_d_start`` logs "all start
args:...", starts the router, whose model load it waits on, then gunicorn with uvicorn workers
and logs "http server pid ..."), lightllm/utils/start_utils.py (each subprocess's "init func
... : init ok", or its error), lightllm/utils/log_utils.py (its format, the one vLLM took:
``INFO 05-20 10:00:00 [api_start.py:120] ...``, so vLLM's format detection also matches it;
LightLLM's own names decide), and uvicorn's "Application startup complete", the shared
vocabulary's ready line.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

_I = Phase.INITIALIZING

LOG_PROFILE: Final = LogProfile(
    markers=(
        # lightllm/server/api_start.py ("all start args:StartArgs(run_mode='normal', ...")
        marker(r"\ball start args:\s*\w+\(", "server_args"),
        # lightllm/utils/start_utils.py ("init func start_router_process : init ok"): each
        # subprocess reports in; the router's holds the model, so its report ends the load
        marker(r"\binit func start_router_process : init ok\b", "weights_end", _I),
        # lightllm/server/api_start.py setup_signal_handlers ("http server pid 4242"): the
        # router (and the model) is up and gunicorn starts
        marker(r"\bhttp server pid \d+", "http_up", _I),
        # gunicorn's master (the command api_start.py runs: "Listening at: http://0.0.0.0:8000")
        marker(r"\bListening at: https?://", "http_up", _I),
    ),
    fatal=(
        # lightllm/utils/start_utils.py: a subprocess that reported anything but "init ok" (its
        # exception's text, which may name the memory family) is logged at ERROR, then exit(1)
        fatal(r"^ERROR \S+ \S+ \[start_utils\.py:\d+\] init func \w+ : ", FailureReason.CRASH),
        # lightllm/server/api_start.py: the start arguments name more than the host has
        fatal(
            r"\bNot enough (?:GPUs|visual_nccl_ports) specified\b|\bInvalid mem_fraction\b",
            FailureReason.CRASH,
        ),
    ),
    detect=(
        # its package (tracebacks, the launch command) and its start-arguments line
        re.compile(r"\b(?:lightllm|LightLLM)\b|\ball start args:\s*StartArgs\("),
    ),
)
