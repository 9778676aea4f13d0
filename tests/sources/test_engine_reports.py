"""Engine self-reports read from replies of the shapes the engines send (ENGINES.md section 8)."""

from __future__ import annotations

import json

import pytest

from exporter.base.model import EngineReport, ModelState, ProbeOutcome
from exporter.config import Target
from exporter.engines import ReportKind
from exporter.sources.probe import Prober
from exporter.sources.probe.reports import read_report
from tests.httpservers import LoopbackServer, reply

TRTLLM = {
    "version": "1.2.0",
    "startup_metrics": {
        "model_loader": {
            "total_model_loading_seconds": 412.5,
            "checkpoint_preparation_seconds": 30.25,
            "weight_population_seconds": 350.0,
            "post_load_processing_seconds": 32.25,
        }
    },
}
SGLANG = b"""# HELP sglang:engine_startup_time The time taken for the engine to start up.
# TYPE sglang:engine_startup_time gauge
sglang:engine_startup_time{model_name="Qwen/Qwen3-32B"} 187.25
# HELP sglang:engine_load_weights_time The time taken for the engine to load weights.
# TYPE sglang:engine_load_weights_time gauge
sglang:engine_load_weights_time{model_name="Qwen/Qwen3-32B"} 96.5
# HELP sglang:startup_time_seconds Startup time per phase.
# TYPE sglang:startup_time_seconds gauge
sglang:startup_time_seconds{phase="load_weights"} 96.5
sglang:startup_time_seconds{phase="cuda_graph"} 41.0
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3-32B"} 0.0
"""
TRITON = [
    {"name": "llama", "version": "1", "state": "READY"},
    {
        "name": "mistral",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "load failed: CUDA out of memory. Tried to allocate 2.00 GiB",
    },
    {"name": "later", "state": "UNAVAILABLE", "reason": "unloaded"},
]


def test_trtllm_server_info_gives_its_load_and_steps():
    report = read_report(ReportKind.TRTLLM_SERVER_INFO, json.dumps(TRTLLM).encode())
    assert report == EngineReport(
        load_seconds=412.5,
        steps=(
            ("checkpoint_preparation", 30.25),
            ("weight_population", 350.0),
            ("post_load_processing", 32.25),
        ),
    )


def test_sglang_metrics_give_startup_load_and_phases():
    report = read_report(ReportKind.SGLANG_METRICS, SGLANG)
    assert report is not None
    assert (report.load_seconds, report.startup_seconds) == (96.5, 187.25)
    assert report.steps == (("load_weights", 96.5), ("cuda_graph", 41.0))


def test_triton_index_gives_every_model_and_which_failed():
    report = read_report(ReportKind.TRITON_INDEX, json.dumps(TRITON).encode())
    assert report is not None
    assert [(m.name, m.state, m.failed) for m in report.models] == [
        ("llama", "READY", False),
        ("mistral", "UNAVAILABLE", True),
        ("later", "UNAVAILABLE", False),  # explicit model control: not asked for yet
    ]
    assert ModelState("m", "1", "UNAVAILABLE", "").failed is False


@pytest.mark.parametrize("kind", list(ReportKind))
@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b"{}", b'{"startup_metrics": 3}'])
def test_replies_of_another_shape_report_nothing(kind, body):
    assert read_report(kind, body) is None


# --- when the prober asks ---------------------------------------------------------------------


def target(url: str, engine: str, health: str = "/health") -> Target:
    return Target("t", engine, url, health, 1.0)


def test_triton_is_asked_for_its_models_every_tick_while_it_starts():
    with LoopbackServer() as srv:
        srv.routes["/v2/health/ready"] = reply(400, b"")
        srv.routes["/v2/repository/index"] = reply(200, TRITON)
        prober = Prober(target(srv.url, "triton", "/v2/health/ready"))
        try:
            results = [prober.sample() for _ in range(3)]
        finally:
            prober.close()
    assert all(r.report is not None and len(r.report.models) == 3 for r in results)
    asks = [r for r in srv.requests if r.path == "/v2/repository/index"]
    assert len(asks) == 3 and asks[0].method == "POST"


def test_trtllm_is_asked_once_it_is_ready_and_its_report_stands():
    with LoopbackServer() as srv:
        srv.routes["/health"] = reply(503, b"")
        srv.routes["/server_info"] = reply(200, TRTLLM)
        prober = Prober(target(srv.url, "trtllm"))
        try:
            starting = prober.sample()
            srv.routes["/health"] = reply(200, b"")
            ready = [prober.sample() for _ in range(3)]
        finally:
            prober.close()
    assert starting.report is None
    assert all(r.outcome is ProbeOutcome.OK and r.report is not None for r in ready)
    assert ready[-1].report is not None and ready[-1].report.load_seconds == 412.5
    assert [r.path for r in srv.requests].count("/server_info") == 1


def test_an_engine_that_does_not_report_is_asked_again_later_not_every_tick():
    with LoopbackServer() as srv:
        srv.routes["/health"] = reply(200, b"")  # SGLang without --enable-metrics: 404
        prober = Prober(target(srv.url, "sglang"))
        try:
            results = [prober.sample() for _ in range(4)]
        finally:
            prober.close()
    assert all(r.ok and r.report is None for r in results)
    assert [r.path for r in srv.requests].count("/metrics") == 1
