"""A tick's log as one block of bytes reads as the same lines given one by one would."""

from __future__ import annotations

import pytest

from exporter.base.model import LogBlock, LogClass, LogReading
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import initial_state
from exporter.core.logblock import block_lines
from exporter.core.observe import TargetWorld, read_log
from exporter.engines import ENGINES

ACCESS = b'INFO:     127.0.0.1:5%04d - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
INFO = b"INFO 05-12 02:45:%02d [metrics.py:455] Avg prompt throughput: %d.0 tokens/s\n"
SERVING = b"".join(ACCESS % i + (INFO % (i % 60, i) if i % 7 == 0 else b"") for i in range(300))
STARTUP = (
    b"INFO 05-12 02:45:01 [api_server.py:1] vLLM API server version 0.8.5\n"
    b"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.2s/it]\r"
    b"Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.1s/it]\n"
    b"   \n"
    b"Traceback (most recent call last):\n"
    b'  File "/app/x.py", line 3, in <module>\n'
    b"    main()\n"
    b"RuntimeError: boom\n"
    b"ERROR 05-12 02:45:30 [engine.py:400] torch.OutOfMemoryError: CUDA out of memory.\n"
)

# A start-up's lines back to back (a warning, a bar redrawn, then plain lines and a request),
# as dense as a start-up log is: the block is handed over line by line in stretches.
DENSE = (
    b"".join(
        b"WARNING 05-12 02:45:%02d [config.py:1] casting torch.bfloat16 to torch.float16\n"
        % (i % 60)
        + b"Loading safetensors checkpoint shards: %d%% Completed | %d/40 [00:01<00:01, 1.2s/it]\r"
        % (i * 2, i)
        + b"Loading safetensors checkpoint shards: %d%% Completed | %d/40 [00:02<00:01, 1.2s/it]\n"
        % (i * 2 + 1, i)
        + (INFO % (i % 60, i)) * (i % 4)
        + ACCESS % i
        for i in range(40)
    )
    + STARTUP.splitlines(keepends=True)[-1]
)


def _world() -> TargetWorld:
    return TargetWorld(initial_state("t"), LogClassifier(ENGINES["vllm"].log))


@pytest.mark.parametrize(
    "data", [SERVING, STARTUP, SERVING + STARTUP + SERVING, DENSE, SERVING + DENSE + SERVING]
)
def test_a_block_gives_the_events_and_counts_its_lines_would(data):
    block = LogBlock(data, 1.7e9, 1)
    by_block = read_log(_world(), None, LogReading(block=block))
    by_line = read_log(_world(), None, block_lines(block))
    assert by_block[0] == by_line[0]
    assert dict(by_block[1].counts) == dict(by_line[1].counts)
    assert by_block[1].news == by_line[1].news


def test_serving_traffic_is_counted_as_requests_and_info_without_events():
    events, tally = read_log(_world(), None, LogReading(block=LogBlock(SERVING, 1.7e9, 1)))
    assert events == ()
    assert dict(tally.counts) == {LogClass.BENIGN: 300, LogClass.INFO: 43}
    assert tally.news


def test_a_fatal_line_inside_traffic_keeps_its_line_number():
    data = SERVING + STARTUP.splitlines(keepends=True)[-1] + SERVING
    events, _ = read_log(_world(), None, LogReading(block=LogBlock(data, 1.7e9, 10)))
    fatal = [e for e in events if e.cls is LogClass.FATAL]
    assert [e.line_no for e in fatal] == [10 + SERVING.count(b"\n")]
