"""A new process dead before the exporter's first sample of it (issue 33), end to end.

A real child writes its pidfile and exits at once, as llama-server does in ~5 ms with a
missing model path. The real exporter must fail that start with the reason, and
``wait --started-after`` must say so at once (exit 1) instead of waiting out its timeout.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from exporter_tooling.processes import free_port
from tests.integration.harness import ROOT, exporter

pytestmark = pytest.mark.integration
INTERVAL = 2.0
_DIES_AT_ONCE = "import os, sys; open(sys.argv[1], 'w').write(f'{os.getpid()}\\n'); sys.exit(1)"


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_wait_started_after_fails_at_once_when_the_new_process_dies_unsampled(tmp_path, reaped):
    pidfile = tmp_path / "engine.pid"
    toml = (
        f'[[target]]\nname = "fast"\nengine = "llamacpp"\n'
        f'base_url = "http://127.0.0.1:{free_port()}"\npidfile = "{pidfile}"\n'
    )
    with exporter(tmp_path, toml, interval=INTERVAL) as exp:
        exp.wait_for(lambda t: t["phase"] == "down", "fast", timeout=20)
        asked = time.time()
        # Two ticks after the death, and wait's own start: an exit 124 would mean it waited.
        wait = subprocess.Popen(
            [sys.executable, "-m", "exporter", "wait", "fast", "--url", exp.url,
             "--started-after", f"{asked:.3f}", "--timeout", f"{4 * INTERVAL}s",
             "--interval", "0.2s"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert wait.stdout is not None
            wait.stdout.readline()  # it has seen the target down: the wait is on
            child = subprocess.Popen([sys.executable, "-c", _DIES_AT_ONCE, str(pidfile)])
            if reaped:
                child.wait(timeout=10)
            out, err = wait.communicate(timeout=30)
            child.wait(timeout=10)
        finally:
            wait.kill()
        assert wait.returncode == 1, (out, err)
        assert "process exited before its first sample" in err, err
        doc = exp.target("fast")
        assert doc["phase"] == "failed" and doc["failure_reason"] == "exited"
        last = doc["last_cold_start"]
        assert last is not None and last["outcome"] == "failed", doc
        assert last["reason"] == "exited"
        assert 0.0 <= last["duration_seconds"] <= 2 * INTERVAL + 1.0
        assert last["started_at"] >= asked - 1.0
