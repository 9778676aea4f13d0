"""Huawei MindIE's log profile (Ascend NPUs), as data: markers, fatal lines.

No code paths: ``exporter.core.classify`` applies it above the shared vocabulary, whose collective
family already knows HCCL, Ascend's NCCL. Sources: the fixture
``shared/fixtures/logs/mindie-01-nccl.log``.
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogProfile, fatal, marker

LOG_PROFILE: Final = LogProfile(
    markers=(
        # issue 13: MindIE's daemon prints "Daemon start success!" once the service is up
        marker(r"Daemon start success", "ready", Phase.READY),
    ),
    fatal=(
        # mindie-01-nccl ("get hccl comm fail by rank:1", "hcclComm is null, rank: 1")
        fatal(r"hccl comm fail|hcclComm is null|HcclRunner\b.*\bfail", FailureReason.NCCL),
        # mindie-01-nccl ("AllGatherHcclRunner_1_1:1 Execute Failed. st: 3")
        fatal(r"\bRunner\w*:\d+\s+Execute Failed\b", FailureReason.CRASH),
    ),
    detect=(re.compile(r"\bmindie\w*|\bHccl\w*Runner\b|\bMindIE\b", re.I),),
)
