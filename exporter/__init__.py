"""inference-lifecycle-exporter: watches LLM inference servers through their lifecycle."""

__version__ = "0.1.0"
