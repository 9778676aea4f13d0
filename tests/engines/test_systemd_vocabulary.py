"""systemd's own lines about a unit, as the shared vocabulary reads them (issue 33).

Worded by systemd's src/core, the same for every engine a unit runs: with no profile and
with each engine's, an exit that is a failure is fatal with its reason, a stop or a clean
exit is not, and the start job is a new run's first line.
"""

from __future__ import annotations

import pytest

from exporter.base.model import FailureReason, LogClass, Phase
from exporter.core.classify import LogClassifier
from exporter.engines import ENGINES
from exporter.engines.profile import LogProfile

PROFILES = {"generic": LogProfile(), **{name: e.log for name, e in ENGINES.items()}}


def _event(profile: str, line: str):
    (event,) = LogClassifier(PROFILES[profile]).classify(line, at=0.0)
    return event


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("sglang.service: Main process exited, code=exited, status=1/FAILURE", "exited"),
        ("llm.service: Main process exited, code=exited, status=203/EXEC", "exited"),
        ("tgi.service: Control process exited, code=exited, status=127/n/a", "exited"),
        ("vllm.service: Main process exited, code=dumped, status=11/SEGV", "crash"),
        ("vllm.service: Main process exited, code=killed, status=6/ABRT", "crash"),
        ("vllm.service: Main process exited, code=killed, status=9/KILL", "killed"),
        ("vllm.service: Failed with result 'exit-code'.", "exited"),
        ("vllm.service: Failed with result 'start-limit-hit'.", "exited"),
        ("vllm.service: Failed with result 'core-dump'.", "crash"),
        ("vllm.service: Failed with result 'timeout'.", "timeout"),
        ("vllm.service: Failed with result 'oom-kill'.", "oom"),
    ],
)
def test_a_units_failed_exit_is_fatal_with_its_reason(profile, line, reason):
    event = _event(profile, line)
    assert (event.cls, event.fatal_reason) == (LogClass.FATAL, FailureReason(reason))


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize(
    "line",
    [
        "vllm.service: Main process exited, code=killed, status=15/TERM",
        "vllm.service: Main process exited, code=killed, status=2/INT",
        "vllm.service: Main process exited, code=exited, status=0/SUCCESS",
        "vllm.service: Deactivated successfully.",
        "Stopped vllm.service - vLLM OpenAI server.",
    ],
)
def test_a_stop_or_a_clean_exit_is_no_failure(profile, line):
    assert _event(profile, line).cls is not LogClass.FATAL


@pytest.mark.parametrize(
    "line", ["Starting vllm.service - vLLM OpenAI server...", "Starting vLLM OpenAI server..."]
)
def test_the_start_job_begins_a_run(line):
    event = _event("generic", line)
    assert (event.phase, event.marker) == (Phase.STARTING, "unit_start")
