"""HTTP probes of targets: the source, its HTTP client, and what the answers mean.

``prober`` is the source; ``client`` (over ``wire``) the bounded HTTP/1.1 client, a leaf that
knows nothing of engines; ``answers`` and ``reports`` read the replies.
"""

from exporter.sources.probe.prober import Prober

__all__ = ["Prober"]
