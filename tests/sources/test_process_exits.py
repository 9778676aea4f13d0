"""A process that ends before the source samples it (issue 33): reported dead, not absent."""

from __future__ import annotations

import subprocess
import sys
import time

from exporter.sources.process import ProcessSource
from tests.sources.test_process import target

# Writes its own pid where the exporter looks, then exits at once (a missing model path).
_DIES_AT_ONCE = "import os, sys; open(sys.argv[1], 'w').write(f'{os.getpid()}\\n'); sys.exit(1)"


def _start_and_reap(pidfile: str) -> int:
    child = subprocess.run([sys.executable, "-c", _DIES_AT_ONCE, pidfile], check=False)
    assert child.returncode == 1
    with open(pidfile, encoding="ascii") as f:
        return int(f.read())


def test_a_pidfile_written_since_the_last_sample_naming_a_gone_pid_is_a_dead_sample(tmp_path):
    pidfile = str(tmp_path / "engine.pid")
    source = ProcessSource(target(pidfile=pidfile))
    assert source.sample() is None  # nothing yet
    time.sleep(0.01)
    pid = _start_and_reap(pidfile)  # started and reaped between two samples
    dead = source.sample()
    assert dead is not None and dead.zombie
    assert dead.pid == pid
    assert abs(dead.create_time - time.time()) < 5
    assert source.sample() is None  # once: the next sample is after its start


def test_a_pidfile_naming_a_gone_pid_when_the_source_begins_is_absence(tmp_path):
    pidfile = str(tmp_path / "engine.pid")
    _start_and_reap(pidfile)
    source = ProcessSource(target(pidfile=pidfile))
    assert source.sample() is None
    assert source.sample() is None
