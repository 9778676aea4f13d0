"""The main process's handles on its worker processes: start them, feed them, follow progress.

The worker program itself is ``exporter_tooling.simulate.worker``; this module only talks to it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import exporter_tooling
from exporter_tooling.simulate.plan import WorkerPlan


class Worker:
    """The simulator's handle on one worker process: start it, feed it, follow its progress.

    Args:
        plan: what the worker does.
    """

    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        self.bytes_read = 0
        self.segments_done = 0
        env = dict(os.environ)
        package_root = str(Path(exporter_tooling.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "exporter_tooling.simulate.worker", plan.to_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._follow, name=f"worker-{plan.rank}")
        self._reader.daemon = True
        self._reader.start()

    @property
    def pid(self) -> int:
        """The worker's pid."""
        return self._proc.pid

    def alive(self) -> bool:
        """Whether the worker is still running."""
        return self._proc.poll() is None

    def start_loading(self) -> None:
        """Tell the worker to read its share of the weights."""
        self._send("load\n")

    def stop(self) -> None:
        """Tell the worker to stop (so it knows the parent is not dying) and end it."""
        self._send("stop\n")
        self._close(self._proc.stdin)
        if self.alive():
            self._proc.terminate()

    def reap(self) -> None:
        """Wait for the stopped worker (SIGKILL after 2 s) and release its pipes."""
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=2)
        self._close(self._proc.stdout)

    def _send(self, text: str) -> None:
        stdin = self._proc.stdin
        try:
            if stdin is not None:
                stdin.write(text)
                stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the worker is gone; the simulator notices through alive()

    def _follow(self) -> None:
        stdout = self._proc.stdout
        if stdout is None:
            return
        for line in stdout:
            kind, _, value = line.partition(" ")
            if kind == "bytes":
                self.bytes_read = int(value)
            elif kind == "done":
                self.segments_done = int(value) + 1

    @staticmethod
    def _close(stream: IO[str] | None) -> None:
        if stream is None:
            return
        with contextlib.suppress(BrokenPipeError):
            stream.close()
