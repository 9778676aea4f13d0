"""What engines report about their own startup, read from their replies (ENGINES.md section 8).

Pure: bodies in, ``EngineReport`` out. The prober fetches them (bounded like every probe) and
absent features are normal, never errors: a reply that is not the expected shape reads as
None. One function per report kind; which kind an engine offers is its profile's data.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from exporter.base.model import EngineReport, ModelState
from exporter.base.redact import redact
from exporter.engines import ReportKind

#: A model's reason as Triton gives it can quote a whole backend traceback: cut it.
REASON_CHARS: Final = 300


#: How each kind is asked: method, path and body.
REQUESTS: Final[Mapping[ReportKind, tuple[str, str, bytes | None]]] = {
    ReportKind.TRTLLM_SERVER_INFO: ("GET", "/server_info", None),
    ReportKind.SGLANG_METRICS: ("GET", "/metrics", None),
    ReportKind.TRITON_INDEX: ("POST", "/v2/repository/index", b"{}"),
}
#: Kinds that say something new while the server starts (asked every tick until ready);
#: the others sum up a finished startup (asked once it is ready).
LIVE: Final = frozenset({ReportKind.TRITON_INDEX})

# TensorRT-LLM's startup_metrics.model_loader keys (NVIDIA/TensorRT-LLM#15993).
_TRTLLM_TOTAL: Final = "total_model_loading_seconds"
_TRTLLM_STEPS: Final = (
    "checkpoint_preparation_seconds",
    "weight_population_seconds",
    "post_load_processing_seconds",
)


def read_report(kind: ReportKind, body: bytes) -> EngineReport | None:
    """The report in one reply of ``kind``; None when the reply holds none."""
    return _READERS[kind](body)


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def read_trtllm_server_info(body: bytes) -> EngineReport | None:
    """``trtllm-serve``'s ``/server_info``: ``startup_metrics.model_loader`` seconds."""
    doc = _json(body)
    metrics = doc.get("startup_metrics") if isinstance(doc, dict) else None
    loader = metrics.get("model_loader") if isinstance(metrics, dict) else None
    if not isinstance(loader, dict):
        return None
    steps = tuple(
        (key.removesuffix("_seconds"), seconds)
        for key in _TRTLLM_STEPS
        if (seconds := _seconds(loader.get(key))) is not None
    )
    total = _seconds(loader.get(_TRTLLM_TOTAL))
    if total is None and not steps:
        return None
    return EngineReport(load_seconds=total, steps=steps)


def read_sglang_metrics(body: bytes) -> EngineReport | None:
    """SGLang's ``/metrics``: its startup and weight-load times, and per-phase seconds.

    ``sglang:engine_startup_time``, ``sglang:engine_load_weights_time`` and
    ``sglang:startup_time_seconds{phase}``, present with ``--enable-metrics``.
    """
    try:
        families = list(text_string_to_metric_families(body.decode("utf-8", "replace")))
    except ValueError:
        return None
    load = startup = None
    steps: list[tuple[str, float]] = []
    for family in families:
        for sample in family.samples:
            if sample.name == "sglang:engine_load_weights_time":
                load = _seconds(sample.value)
            elif sample.name == "sglang:engine_startup_time":
                startup = _seconds(sample.value)
            elif (
                sample.name == "sglang:startup_time_seconds"
                and "phase" in sample.labels
                and (seconds := _seconds(sample.value)) is not None
            ):
                steps.append((sample.labels["phase"][:40], seconds))
    if load is None and startup is None and not steps:
        return None
    return EngineReport(load_seconds=load, startup_seconds=startup, steps=tuple(steps))


def read_triton_index(body: bytes) -> EngineReport | None:
    """Triton's ``POST /v2/repository/index``: every model with its state and reason."""
    doc = _json(body)
    if not isinstance(doc, list):
        return None
    models = tuple(m for entry in doc if (m := _triton_model(entry)) is not None)
    return EngineReport(models=models) if models else None


def _triton_model(entry: object) -> ModelState | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    reason = entry.get("reason")
    return ModelState(
        name=str(entry["name"])[:100],
        version=str(entry.get("version", ""))[:20],
        state=str(entry.get("state", "")).upper()[:20],
        reason=redact(reason)[:REASON_CHARS] if isinstance(reason, str) and reason else None,
    )


_READERS: Final[Mapping[ReportKind, Callable[[bytes], EngineReport | None]]] = {
    ReportKind.TRTLLM_SERVER_INFO: read_trtllm_server_info,
    ReportKind.SGLANG_METRICS: read_sglang_metrics,
    ReportKind.TRITON_INDEX: read_triton_index,
}
