"""Xinference's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from Xinference's source and docs
(issue 33; no fixture log exists): the logging format of xinference/deploy/utils.py
(``2024-04-16 06:46:39,265 xinference.core.supervisor 10148 INFO     ...``), the supervisor's
start (xinference/deploy/supervisor.py: "Xinference successfully started. Endpoint: http://...";
xinference/core/supervisor.py: "Xinference supervisor 0.0.0.0:14154 started"), the worker's
(xinference/core/worker.py: "Metrics server is started at:", "Failed to load model ..." with
its traceback). Models are launched later, each in a backend Xinference hosts (vLLM, SGLang,
llama.cpp, LMDeploy), whose lines its log carries: detection is by Xinference's own names.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker, wrapper

_R = Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # xinference/core/supervisor.py ("Xinference supervisor 0.0.0.0:14154 started")
        marker(r"\bXinference supervisor \S+ started\b", "supervisor_up"),
        # xinference/core/worker.py ("Metrics server is started at: http://0.0.0.0:34531"),
        # xinference/deploy/worker.py ("Xinference worker successfully started.")
        marker(
            r"\bXinference worker successfully started\b|\bMetrics server is started at\b",
            "worker_up",
        ),
        # xinference/core/utils.py log_async, debug ("Enter launch_builtin_model, args: ...")
        marker(r"\bEnter launch_builtin_model\b", "model_launch"),
        # xinference/deploy/supervisor.py start_supervisor_components: the REST API serves
        marker(r"\bXinference successfully started\. Endpoint: https?://", "ready", _R),
    ),
    fatal=(
        # xinference/core/supervisor.py's health check: after "Worker timeout. address: ...,
        # check count remaining N" runs out, the worker is given up ("Worker dead. address:")
        fatal(r"\bWorker dead\. address: ", FailureReason.CRASH),
    ),
    wrappers=(
        # xinference/core/worker.py launch_builtin_model ("Failed to load model qwen-1-0"
        # with its traceback): the traceback's last line names why
        wrapper(r"\bxinference\.core\.worker\b.*\bFailed to load model\b"),
    ),
    detect=(
        # its loggers in its own format, its name, its commands and its actor framework
        re.compile(
            r"\bxinference(?:\.[a-z_]+)*\s+\d+\s+(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b"
            r"|\bXinference\b|\bxinference-(?:local|supervisor|worker)\b"
        ),
    ),
)
