"""Ray Serve LLM's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from Ray Serve's source (issue 33;
no fixture log exists): the controller's deployment state machine
(python/ray/serve/_private/deployment_state.py: "Deploying new version of Deployment(...)",
"Adding 1 replica to Deployment(...)", "The deployment failed to start 3 times in a row"), the
application state (application_state.py: "Deploying app 'default' failed with exception:" and
its traceback), ``serve.run``'s "Application 'default' is ready at http://127.0.0.1:8000/",
and the Ray worker prefixes every forwarded line carries (``(ServeController pid=123)``,
``(ServeReplica:default:LLMServer pid=456)``). Its LLM replicas run vLLM, whose load lines
they forward: detection is by Ray Serve's own names.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines import vllm
from exporter.engines.profile import LogProfile, fatal, loading_markers, marker, wrapper

_L, _R = Phase.LOADING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # deployment_state.py ("Deploying new version of Deployment(name='LLMServer', ...")
        marker(r"\bDeploying new version of Deployment\(", "deploying"),
        # deployment_state.py ("Adding 1 replica to Deployment(name='LLMServer', app='default').",
        # older "Adding 1 replica to deployment StableDiffusionV2 in application 'default'."):
        # the replica's constructor loads the engine
        marker(r"\bAdding \d+ replicas? to deployment\b", "weights_begin", _L),
        # serve/_private/client.py ("Application 'default' is ready at http://127.0.0.1:8000/.",
        # older "Deployment 'echo:s8cys2ug' is ready at `http://127.0.0.1:8000/`"), serve/api.py
        # ("Deployed app 'default' successfully.")
        marker(
            r"\b(?:Application|Deployment) '[^']*' is ready at `?https?://"
            r"|\bDeployed app(?: '[^']*')? successfully\b",
            "ready",
            _R,
        ),
        # the vLLM engine inside each LLM replica (vllm.py), its ready line excepted
        *loading_markers(vllm.LOG_PROFILE),
    ),
    fatal=(
        # deployment_state.py: the controller gives up on a deployment's replicas
        fatal(r"\bThe deployment failed to start \d+ times in a row\b", FailureReason.CRASH),
        *vllm.LOG_PROFILE.fatal,
    ),
    wrappers=(
        # application_state.py ("Deploying app 'default' failed with exception:" + traceback),
        # and serve.run's wording of the same status ("Deploying application default failed")
        wrapper(r"\bDeploying app(?:lication)? '?[\w.-]+'? failed\b"),
        *vllm.LOG_PROFILE.wrappers,
    ),
    detect=(
        # Ray's prefixes on Serve's actors' lines, and Serve's own module names
        re.compile(
            r"\((?:ServeController|ServeReplica:\S+|ProxyActor|HTTPProxyActor) pid=\d+"
            r"|\bray\.serve(?:\.llm)?\b|\bray\[serve"
        ),
        # Serve's own log format, where Ray adds no prefix (serve/_private/logging_utils.py:
        # "INFO 2025-10-10 01:57:27,668 controller 1700 -- Adding 1 replica to ...")
        re.compile(
            r"^(?:DEBUG|INFO|WARNING|ERROR) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
            r"(?:controller|serve|proxy) \S+ (?:\w+\.py:\d+ )?--? "
        ),
    ),
)
