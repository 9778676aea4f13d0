"""Ollama's log profile, as data: markers, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it above the shared vocabulary. Ollama embeds
llama.cpp (its runner prints llama.cpp's loader lines) and logs the rest with Go's slog
(``time=... level=INFO source=server.go:431 msg="..."``). Sources: the fixtures in
``shared/fixtures/logs/ollama-*.log``.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines import llamacpp
from exporter.engines.profile import LogProfile, benign, fatal, loading_markers, marker

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # ollama-01-ready ("Listening on 127.0.0.1:11434 (version 0.16.1)"): the API serves
        # before any model is loaded, so this is not the ready line
        marker(r"msg=\"Listening on \S+ \(version", "http_up"),
        # ollama-01/02-ready ("starting runner" cmd=".../ollama runner --model ...")
        marker(r"msg=\"starting runner\" cmd=\"[^\"]*--model\b", "weights_begin", _L),
        # ollama-02-ready ("Server listening on 127.0.0.1:43625"): the runner's own port
        marker(r"msg=\"Server listening on", "runner_up", _L),
        # ollama-01/02-ready ("llama runner started in 9.88 seconds")
        marker(r"llama runner started in\b", "ready", _R),
        # ollama-01-ready: the embedded llama.cpp loader's markers
        *loading_markers(llamacpp.LOG_PROFILE),
    ),
    fatal=(
        # issue 13: the runner dying before it reports started ("llama runner process has
        # terminated: exit status 2"), and a failed model load ("error loading model")
        fatal(
            r"llama runner process (?:has )?terminated|error loading llama server",
            FailureReason.CRASH,
        ),
        *llamacpp.LOG_PROFILE.fatal,
    ),
    benign=(
        # ollama-01-ready ("Couldn't find '/root/.ollama/id_ed25519'. Generating new private key.")
        benign(r"Couldn't find '[^']*id_ed25519'|Your new public key is"),
        # ollama-02-ready: [GIN] access lines (a 500 after ready is a client's timeout)
        benign(r"^\[GIN\] "),
    ),
    detect=(
        # llamacpp-05-crash: a model path under "ollama_models/" is no Ollama; its settings
        # are upper case (OLLAMA_HOST)
        re.compile(
            r"\bollama\b|(?-i:OLLAMA_[A-Z]+)|source=\w+\.go:\d+|\[GIN\] |llama runner started",
            re.I,
        ),
    ),
)
