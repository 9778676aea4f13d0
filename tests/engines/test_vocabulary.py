"""The shared vocabulary alone (no engine profile) names each family in wordings no fixture has.

Each case is the *next* engine's wording of a family the corpus showed once (issue 33), so a
pattern fitted to one fixture line fails here; the twins beside them must stay quiet.
"""

from __future__ import annotations

import pytest

from exporter.base.model import (
    FailureReason,
    LogClass,
    Observation,
    Phase,
    ProbeKind,
    ProbeOutcome,
    ProbeResult,
    ProcessSample,
)
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import TargetState, Thresholds, initial_state, step
from exporter.engines.profile import LogProfile


def classify(*lines: str):
    """Every event of the lines, classified with the shared vocabulary only."""
    classifier = LogClassifier(LogProfile())
    events = [e for line in lines for e in classifier.classify(line, at=0.0)]
    return events + classifier.finish()


def fatal_reasons(*lines: str) -> list[FailureReason | None]:
    return [e.fatal_reason for e in classify(*lines) if e.cls is LogClass.FATAL]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        # memory: what a check needs against what is left, in other engines' words
        (
            "ValueError: 12.0 GiB of KV cache memory is required, which is more than the "
            "available 3.1 GiB",
            "oom",
        ),
        ("RuntimeError: weights need 40 GB; requested more than the free VRAM on cuda:0", "oom"),
        ("ERROR: the model requires 22.4 GiB, which exceeds the available GPU memory", "oom"),
        # collective rendezvous: a rank missing, torch.distributed's store giving up
        ("[Gloo] Rank 3 is NOT connected to: [0, 1]", "nccl"),
        (
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for "
            "clients. 1/2 clients joined.",
            "nccl",
        ),
        ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "nccl"),
        # killed from outside, as each supervisor words it
        ('level=ERROR msg="runner exited" error="signal: killed"', "killed"),
        ("Main process exited, code=killed, status=9/KILL", "killed"),
        ("worker 2 died with <Signals.SIGKILL: 9>", "killed"),
        ("./serve.sh: line 12: 48121 Killed                  python -m server", "killed"),
        ("ERROR: engine process exited with exit code 137", "killed"),
        # Rust and Go mains returning their error
        ("Error: Could not create backend", "crash"),
        ("Error: failed to parse the model config: missing field `hidden_size`", "crash"),
        ("2025-01-01T00:00:00Z ERROR server: server shutdown with error: bind failed", "crash"),
        # a model status table row holding an error status (Triton's server.cc table)
        ("| llama | 2       | UNAVAILABLE: Invalid argument: model config missing |", "crash"),
        # a serving framework giving up on the replica that runs the engine
        ("The deployment failed to start 3 times in a row. See controller logs.", "crash"),
        ("Replica(id='a1', deployment='LLM') failed to initialize: actor died", "crash"),
    ],
)
def test_each_family_is_fatal_in_wordings_no_fixture_has(line, reason):
    assert fatal_reasons(line)[:1] == [FailureReason(reason)]


@pytest.mark.parametrize(
    "line",
    [
        # reports and settings, not failures
        "[Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected peer ranks"
        " is : 7",
        "INFO 01-01 00:00:00 required memory 4.2 GiB is less than the available 70 GiB",
        "| llama | 2       | UNAVAILABLE: unloaded |",
        "| llama | 2       | READY  |",
        "[WARNING] model_hosting_container_standards - loader.py:71: Failed to load function "
        "from spec 'model:handler': HandlerFileNotFoundError",
        "INFO: request finished in 2 s. Error: none",
        "cause: Caused by a slow disk, retrying",
        "terminated by signal SIGTERM",
        # a panic recovered by the server, one request's, and an aborted request
        "2024/01/01 12:00:00 http: panic serving 10.0.0.1:5555: runtime error: index out of range",
        "[GIN-debug] [Recovery] panic recovered:",
        "INFO 01-01 00:00:00 [async_llm.py:1] Aborted request cmpl-1234.",
    ],
)
def test_their_twins_stay_quiet(line):
    assert fatal_reasons(line) == []


def test_the_rendezvous_failure_outranks_the_launchers_timeout_after_it():
    reasons = fatal_reasons(
        "[Gloo] Rank 5 is NOT connected to: [2]",
        "TimeoutError: Server failed to start within the timeout period.",
    )
    assert reasons[0] is FailureReason.NCCL


def test_a_kill_outranks_the_crash_worded_on_the_same_line():
    (event,) = classify('msg="error loading model" error="runner process crashed: signal: killed"')
    assert event.fatal_reason is FailureReason.KILLED


def test_a_traceback_excerpt_without_its_header_ends_in_its_exception():
    reasons = fatal_reasons(
        '  File "/srv/app/loader.py", line 88, in open_checkpoint',
        "    header = read_header(f)",
        "tokenizers.TokenizerError: unexpected end of file",
    )
    assert reasons == [FailureReason.CRASH]


def test_bare_frames_without_an_exception_line_are_no_failure():
    # faulthandler-like dumps and frames quoted mid-log: nothing named a cause
    assert (
        fatal_reasons(
            '  File "/srv/app/loader.py", line 88, in open_checkpoint',
            "loading shard 3 of 8",
            "ValueError: shown in a later, unrelated message",
        )
        == []
    )


def test_a_controller_failing_the_replica_takes_its_tracebacks_cause():
    reasons = fatal_reasons(
        "ERROR 2026-01-01 00:00:00,000 controller 77 -- Exception in Replica(id='x', "
        "deployment='LLMServer', app='llms'), the replica will be stopped.",
        "Traceback (most recent call last):",
        '  File "/ray/serve/_private/replica.py", line 9, in initialize',
        "    self._init()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    assert reasons[0] is FailureReason.OOM


@pytest.mark.parametrize(
    "line",
    [
        "Serving on http://0.0.0.0:1234.",
        "Please connect to custom endpoint at http://localhost:5001",
        "3:04PM INF LocalAI API is listening! Please connect to the endpoint for API "
        "documentation. endpoint=http://0.0.0.0:8080",
        "2024-01-01 00:00:00,000 xinference 1 INFO Xinference successfully started. "
        "Endpoint: http://127.0.0.1:9997",
        "Application 'llms' is ready at http://127.0.0.1:8000/.",
        "I0101 00:00:00.000000 1 grpc_server.cc:2495] Started GRPCInferenceService at 0.0.0.0:8001",
    ],
)
def test_ready_announcements_worded_otherwise_are_ready(line):
    (event,) = classify(line)
    assert (event.cls, event.phase) == (LogClass.MARKER, Phase.READY)


@pytest.mark.parametrize(
    "line",
    [
        # listening before the load (llama.cpp), a client waiting for someone else's server
        "main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 15",
        "Waiting to connect to the server at http://127.0.0.1:30000",
        "I0101 00:00:00.000000 1 http_server.cc:1] Started Metrics Service at 0.0.0.0:8002",
    ],
)
def test_early_or_foreign_announcements_are_not_ready(line):
    assert all(e.phase is not Phase.READY for e in classify(line))


@pytest.mark.parametrize(
    "line",
    [
        # Go's runtime, bare or under a container runtime's timestamp
        "panic: runtime error: invalid memory address or nil pointer dereference",
        "2025-01-01T00:00:05.123456789Z panic: listen tcp :8080: bind: address already in use",
        "fatal error: concurrent map writes",
        "goroutine 1 [running]:",
        # Rust's runtime, C++'s, and an abort as a shell reports it
        "thread 'main' panicked at src/main.rs:10:5:",
        "fatal runtime error: stack overflow",
        "thread 'tokio-runtime-worker' has overflowed its stack",
        "terminate called without an active exception",
        "terminate called recursively",
        "Aborted (core dumped)",
        "./serve.sh: line 7:  4242 Aborted                 ./server --port 8080",
    ],
)
def test_a_runtime_giving_up_is_a_crash_in_each_languages_words(line):
    assert fatal_reasons(line)[:1] == [FailureReason.CRASH]


def test_a_panic_after_the_listening_line_fails_the_start():
    # Issue 33: a server that printed its listening line, then panicked before answering a
    # probe, crashed in its start; it was never a ready server. Classified by the shared
    # vocabulary alone (an engine without a profile), fed to the lifecycle tick by tick.
    classifier = LogClassifier(LogProfile())
    t0 = 1_700_000_000.0
    proc = ProcessSample(
        pid=7, create_time=t0, pids=(7,), rss_bytes=2**20, cpu_seconds=1.0, read_bytes=0
    )
    refused = ProbeResult(ProbeKind.HEALTH, ProbeOutcome.REFUSED, None, 0.001, t0)
    ticks = [
        ["2025/01/01 00:00:01 starting", "2025/01/01 00:00:02 listening on 0.0.0.0:8080"],
        [
            'panic: open /models/llama.gguf: no model loaded for "llama"',
            "",
            "goroutine 1 [running]:",
            "main.main()",
            "\t/src/server/main.go:42 +0x1d",
        ],
    ]
    state = initial_state("t")
    for i, lines in enumerate(ticks, 1):
        now = t0 + i
        events = tuple(e for text in lines for e in classifier.classify(text, at=now))
        obs = Observation(target="t", at=now, process=proc, health=refused, log_events=events)
        state = step(state, obs, now, Thresholds())
    assert (state.phase, state.failure_reason) == (Phase.FAILED, FailureReason.CRASH)
    assert state.reason_detail is not None and "panic: open /models" in state.reason_detail


def _listening_then(fatal_line: str, health: ProbeResult | None) -> TargetState:
    """A probe-less (or probed) unknown engine: its listening line, then one fatal line."""
    classifier = LogClassifier(LogProfile())
    t0 = 1_700_000_000.0
    proc = ProcessSample(
        pid=7, create_time=t0, pids=(7,), rss_bytes=2**20, cpu_seconds=1.0, read_bytes=0
    )
    state = initial_state("t")
    for i, text in enumerate(["2025/01/01 00:00:02 listening on 0.0.0.0:8080", fatal_line], 1):
        now = t0 + i
        events = tuple(classifier.classify(text, at=now))
        obs = Observation(target="t", at=now, process=proc, health=health, log_events=events)
        state = step(state, obs, now, Thresholds())
    return state


def test_a_panic_after_a_listening_line_no_probe_confirmed_fails_the_start():
    # The log's ready line was the only witness (no probe for this target, as in replay-log):
    # a runtime that gives up next never served; its start failed, with the panic as detail.
    state = _listening_then("thread 'main' panicked at src/main.rs:10:5:", None)
    assert (state.phase, state.failure_reason) == (Phase.FAILED, FailureReason.CRASH)
    assert state.reason_detail is not None and "panicked at src/main.rs" in state.reason_detail


def test_a_fatal_line_after_a_probe_said_ready_is_not_a_failed_start():
    # A probe that answered OK proved the server up: the fatal line is no start's failure.
    ok = ProbeResult(ProbeKind.HEALTH, ProbeOutcome.OK, 200, 0.001, 1_700_000_000.0)
    state = _listening_then("thread 'main' panicked at src/main.rs:10:5:", ok)
    assert state.phase is Phase.READY
