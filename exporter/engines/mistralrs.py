"""mistral.rs's log profile, as data: markers, fatal lines, detection.

No code paths: ``exporter.core.classify`` applies it. Written from mistral.rs's source (issue 33;
no fixture log exists): mistralrs-server/src/main.rs (the listener is bound before the model
loads, and "OpenAI-compatible server listening on http://..." is logged once the router is
built, after the load), mistralrs-core/src/lib.rs (the warm-up "dummy run") and the
``tracing`` targets every line carries (``INFO mistralrs_core::pipeline::normal: ...``).
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # mistralrs-core/src/pipeline/normal.rs ("Loading `config.json` at `Qwen/Qwen3-4B`")
        marker(r"mistralrs_core::pipeline::\w+: Loading `[^`]+` (?:at|locally)\b", "download"),
        # mistralrs-core/src/utils/varbuilder_utils.rs ("Loading model using mmap strategy."),
        # mistralrs-quant/src/utils/log.rs ("Loading model according to the following
        # repeating layer mappings:"): the weights are being read
        marker(
            r"mistralrs_\w+(?:::\w+)*: Loading model (?:using \w+ strategy|according to)",
            "weights_begin",
            _L,
        ),
        # mistralrs-core/src/lib.rs ("Beginning dummy run.", "Dummy run completed in 1.2s.")
        marker(r"mistralrs_core\S*: Beginning dummy run\b", "warmup", _I),
        marker(r"mistralrs_core\S*: Dummy run completed in\b", "engine_ready", _I),
        # mistralrs-server/src/main.rs ("OpenAI-compatible server listening on http://0.0.0.0:1234.",
        # older releases "Serving on http://..."), logged once the model is in
        marker(
            r"\bOpenAI-compatible server listening on https?://"
            r"|mistralrs_server\S*: Serving on https?://",
            "ready",
            _R,
        ),
    ),
    fatal=(
        # mistralrs-server/src/main.rs: the HTTP or MCP server task ending in error
        # ("OpenAI server error: ...", "MCP server error: ...", printed with eprintln!)
        fatal(r"^(?:OpenAI|MCP) server error: ", FailureReason.CRASH),
    ),
    detect=(
        # the crates' tracing targets and the binary's name
        re.compile(
            r"\bmistralrs_(?:core|server|server_core|quant|vision|audio|mcp)\b|mistralrs-server"
        ),
    ),
)
