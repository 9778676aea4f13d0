"""Where the exporter's RSS goes: its imports, measured in a fresh interpreter, and the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Final

import psutil

from exporter_tooling.bench.records import RssBreakdown
from exporter_tooling.bench.servers import Server

MIB: Final = 2**20
#: What ``run`` imports before its first tick: ``cli.serve``'s imports, which bring the daemon's.
DAEMON_MODULES: Final = (
    "exporter.cli",
    "prometheus_client",
    "exporter.config",
    "exporter.daemon",
    "exporter.render.metrics",
    "exporter.render.page",
    "exporter.render.status",
    "exporter.render.trail",
    "exporter.web.server",
)
#: A library that adds less than this is counted with the other small ones.
SMALL: Final = MIB // 4
SCRIPT: Final = Path(__file__).with_name("import_rss.py")


def where_rss_goes(server: Server) -> RssBreakdown | str:
    """The server's RSS split into what its imports cost and the rest; or why it could not be."""
    try:
        process = psutil.Process(server.popen.pid)
        memory, threads = process.memory_info(), process.num_threads()
    except psutil.Error as exc:
        return f"cannot read the exporter's memory: {exc}"
    listed = _run("list", *DAEMON_MODULES)
    if listed.returncode != 0:
        return f"listing the daemon's imports failed: {listed.stderr.strip()[-300:]}"
    measured = _run("measure", stdin=listed.stdout)
    if measured.returncode != 0:
        return f"measuring the daemon's imports failed: {measured.stderr.strip()[-300:]}"
    parts = [(str(label), int(size)) for label, size in json.loads(measured.stdout)]
    (_, interpreter), imports = parts[0], parts[1:]
    shares = {label: size for label, size in imports if size >= SMALL}
    shares["other libraries"] = sum(size for label, size in imports if size < SMALL)
    rest = memory.rss - interpreter - sum(size for _, size in imports)
    return {
        "rss_mib": _mib(memory.rss),
        "file_backed_mib": _mib(memory.shared),
        "anonymous_mib": _mib(memory.rss - memory.shared),
        "threads": threads,
        "interpreter_mib": _mib(interpreter),
        "imports_mib": {label: _mib(size) for label, size in shares.items()},
        "rest_mib": _mib(rest),
    }


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _mib(size: int) -> float:
    return round(size / MIB, 1)
