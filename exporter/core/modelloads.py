"""Which model a weight load is for: the main model's, or a speculative draft's after it.

No I/O. Engines log the same "loading weights" lines for a draft model as for the main one
(SGLang and vLLM with speculative decoding); a load that begins on a rank after that rank's
load ended is the draft's, and its progress is kept apart (``draft:shards``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_RANK = re.compile(r"(?:\bTP|_TP)(\d+)\b|\brank[= ](\d+)\b", re.I)


@dataclass(slots=True)
class ModelLoads:
    """Weight loads seen per rank in one run of the engine."""

    #: Loads after the first: 0 while the main model loads, 1 once a draft's has begun.
    index: int = 0
    _ended: set[str] = field(default_factory=set)

    def note(self, marker: str | None, text: str) -> None:
        """Count a ``weights_begin`` or ``weights_end`` marker's line; others change nothing."""
        if marker not in ("weights_begin", "weights_end"):
            return
        m = _RANK.search(text)
        rank = (m.group(1) or m.group(2)) if m else "-"
        if marker == "weights_end":
            self._ended.add(rank)
        elif rank in self._ended:
            self._ended.discard(rank)
            self.index += 1

    def key(self, key: str, *, per_model: bool) -> str:
        """A progress key as counted for the model now loading (``draft:`` for a draft's)."""
        return f"draft:{key}" if per_model and self.index > 0 else key
