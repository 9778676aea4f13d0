"""Text Generation Inference's log profile, as data: markers, fatal lines, noise.

No code paths: ``exporter.core.classify`` applies it. Sources: ENGINES.md section 5 (TGI) and the
fixtures in ``shared/fixtures/logs/tgi-*.log``.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import (
    LogProfile,
    benign,
    fatal,
    marker,
    progress,
)

_L, _I, _R = Phase.LOADING, Phase.INITIALIZING, Phase.READY

LOG_PROFILE: Final = LogProfile(
    markers=(
        # ENGINES.md TGI ("Starting check and download process for {model_id}")
        marker(r"Starting check and download process|Successfully downloaded weights", "download"),
        # ENGINES.md TGI ("Starting shard"): the shard process loads the weights
        marker(r"Starting shard\b", "weights_begin", _L),
        progress(
            r"Loading (?:safetensors )?checkpoint shards\s*:\s*\d+%.*?\|\s*"
            r"(?P<done>\d+)/(?P<total>\d+)",
            "shards",
            _L,
            per_model=True,
        ),
        # tgi-05-other ("Server started at unix:///tmp/text-generation-server-1")
        marker(r"Server started at unix://", "shard_server", _I),
        # ENGINES.md TGI; tgi-05-other ("Shard ready in 55.201097835s rank=1")
        marker(r"Shard ready in\b", "weights_end", _I),
        # ENGINES.md TGI ("Starting Webserver", "Warming up model"); tgi-09-crash
        marker(r"Starting Webserver|Serving revision \S+ of model", "http_up", _I),
        marker(r"Warming up model|Setting max batch total tokens", "warmup", _I),
        # ENGINES.md TGI ("Connected"): the router serves after the warm-up
        marker(r"(?:^|[:\]]\s*)Connected\s*$", "ready", _R),
    ),
    fatal=(
        # tgi-02-oom ("Shard 0 failed to start", "Error: ShardCannotStart")
        fatal(
            r"Shard \d+ failed to start|\bShardCannotStart\b|Shard \d+ crashed", FailureReason.CRASH
        ),
        # tgi-07-oom ("Webserver Crashed", "Error: WebserverFailed")
        fatal(r"Webserver Crashed|\bWebserverFailed\b", FailureReason.CRASH),
        # tgi-09-crash ("Method Warmup encountered an error.")
        fatal(r"Method \w+ encountered an error", FailureReason.CRASH),
        # tgi-07-oom: router panic during the warm-up (the oom patterns catch its reason first)
        fatal(r"Unable to warmup model", FailureReason.CRASH),
    ),
    benign=(
        # tgi-01-hang, tgi-06-other: printed every 10 s whether or not the shard makes progress
        benign(r"Waiting for shard to be ready"),
        # tgi-07-oom: the Rust hint printed under every panic
        benign(r"run with `RUST_BACKTRACE=1`"),
    ),
    detect=(
        # tgi-08-oom: the router's gRPC client crate names itself on warm-up errors
        re.compile(
            r"text_generation_(?:launcher|router|server|client)|shard-manager|text-generation-"
        ),
    ),
)
