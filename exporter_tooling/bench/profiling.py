"""py-spy recordings of the exporter: ``--profile``'s files, and where the sampling CPU goes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Final

import exporter
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


#: Our package's files, as py-spy names them.
PACKAGE: Final = str(Path(exporter.__file__).resolve().parent) + "/"
#: A sample's time belongs to the first of our files met walking up from its leaf frame
#: (paths relative to ``PACKAGE``; the first fragment that starts the path names it).
#: Library frames (h11, psutil, the standard library) count for the code of ours that called them.
COMPONENTS: Final = (
    ("sources/probe/", "probes (HTTP)"),
    ("sources/process/", "process trees"),
    ("sources/logs.py", "logs"),
    ("sources/gpu/", "GPUs (both processes)"),
    ("sources/disk.py", "disks and pressure"),
    ("sources/pressure.py", "disks and pressure"),
    ("sources/__init__.py", "source runner (threads, hand-offs)"),
    ("core/", "lifecycle core (observe, step, snapshot)"),
    ("render/", "rendering"),
    ("history.py", "history"),
    ("daemon.py", "loop"),
    ("", "other of ours"),
)
OUTSIDE: Final = "outside our code (interpreter, thread start-up)"
#: How long past its recording py-spy may take to write it out before it is killed (it has
#: hung on a loaded 2-vCPU VM, which cost a whole `make bench` its report).
SPY_GRACE_SECONDS: float = 60.0


def py_spy(server: Server, out: Path, seconds: float, rate: int = 200) -> str:
    """Record ``server`` (and its NVML child) with py-spy; the file written, or why not."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(exe, os.X_OK):
        return "py-spy not found (pip install py-spy)"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [exe, "record", "--pid", str(server.popen.pid), "--subprocesses", "--nonblocking"]
    argv += ["--rate", str(rate), "--duration", str(max(1, round(seconds))), "--format"]
    argv.append("speedscope")
    try:
        done = subprocess.run(
            [*argv, "-o", f"{out}.speedscope.json"],
            capture_output=True,
            text=True,
            timeout=seconds + SPY_GRACE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:  # a diagnostic: the run's figures go on without it
        return f"py-spy did not finish within {seconds + SPY_GRACE_SECONDS:.0f} s (killed)"
    if done.returncode != 0:
        return f"py-spy failed: {done.stderr.strip()[-300:]}"
    return f"{out}.speedscope.json"


def where_cpu_goes(server: Server, seconds: float) -> dict[str, float] | str:
    """Shares of the server's busy samples by component (percent), or why there are none.

    py-spy leaves idle threads out, so the shares are of the CPU the server spends.
    """
    with tempfile.TemporaryDirectory(prefix="bench-spy-") as tmp:
        recorded = py_spy(server, Path(tmp) / "where", seconds, rate=1000)
        if not recorded.endswith(".speedscope.json"):
            return recorded
        return component_shares(json.loads(Path(recorded).read_text()))


def component_shares(speedscope: dict[str, Any]) -> dict[str, float] | str:
    """Percent of the sampled weight per component, largest first, from a speedscope document."""
    frames = speedscope["shared"]["frames"]
    names = [_component(str(f.get("file", ""))) for f in frames]
    weights: Counter[str] = Counter()
    for profile in speedscope["profiles"]:
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            # Stacks run root first: the leaf is last.
            owner = next((names[i] for i in reversed(stack) if names[i] != OUTSIDE), OUTSIDE)
            weights[owner] += weight
    total = sum(weights.values())
    if not total:
        return "py-spy took no samples (the exporter was idle)"
    return {name: round(100 * w / total, 1) for name, w in weights.most_common()}


def _component(file: str) -> str:
    if not file.startswith(PACKAGE):
        return OUTSIDE
    path = file.removeprefix(PACKAGE)
    return next(name for fragment, name in COMPONENTS if path.startswith(fragment))
