"""``--profile``: py-spy recordings of the exporter after the measured windows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from exporter_tooling.bench.scrape_client import client_argv
from exporter_tooling.bench.servers import Server
from exporter_tooling.bench.sizes import Sizes


def profile_scrapes(server: Server, out: Path, sizes: Sizes) -> str:
    """Record ``server`` while one client scrapes it; the file written, or why not."""
    seconds = max(5.0, sizes.concurrent_seconds)
    argv = client_argv(
        {"mode": "concurrent", "port": server.port, "scrapers": 1, "seconds": seconds}
    )
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL) as client:
        result = py_spy(server, out, seconds)
        client.wait()
    return result


def py_spy(server: Server, out: Path, seconds: float) -> str:
    """Record ``server`` (and its NVML child) with py-spy; the file written, or why not."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(exe, os.X_OK):
        return "py-spy not found (pip install py-spy)"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [exe, "record", "--pid", str(server.popen.pid), "--subprocesses", "--nonblocking"]
    argv += ["--rate", "200", "--duration", str(max(1, round(seconds))), "--format", "speedscope"]
    done = subprocess.run(
        [*argv, "-o", f"{out}.speedscope.json"],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    if done.returncode != 0:
        return f"py-spy failed: {done.stderr.strip()[-300:]}"
    return f"{out}.speedscope.json"
