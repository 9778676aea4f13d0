"""The ``bench`` subcommand: scrape latency, sampling cost, memory and detection times.

Starts everything it measures as real processes (idle process trees, the exporter, simulators,
node_exporter, scrape clients) and measures them from outside, through /proc and HTTP. It
writes only its work directory and the JSON report, and stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from exporter_tooling.bench.measure import NODE_EXPORTER, measure
from exporter_tooling.bench.sizes import QUICK, SECTIONS, Sizes
from exporter_tooling.bench.table import render_table
from exporter_tooling.bench.waiting import BenchError

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
DEFAULT_OUT: Final = "artifacts/bench.json"

EPILOG: Final = """exit codes:
  0  every section ran (a goal may still be missed: see the table and the JSON "goals")
  1  a section could not run (a process did not start or answer; see the message)
  2  usage error

sections: scrape (latency sequential and under concurrent scrapers, CPU per scrape, RSS over
the sequential scrapes, node_exporter the same way), sampling (CPU of the exporter and its
NVML child per tick, for the cost curve over targets), ready (simulator ready -> exporter
ready), stall (hang -> stall flag), logs (the classifier on serving access lines and on the
shared corpus; one target logging 2,000 and 20,000 lines/s; a fatal line after a flood; 8
targets sharing one log).
"""


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``bench``."""
    p.epilog = EPILOG
    p.add_argument("--out", default=DEFAULT_OUT, help=f"JSON report path (default {DEFAULT_OUT})")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: runs in seconds to prove the bench works; its figures mean little",
    )
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})",
    )
    p.add_argument("--scrapes", type=int, help="sequential scrapes (default 100000)")
    p.add_argument("--starts", type=int, help="simulated cold starts per interval (default 20)")
    p.add_argument(
        "--node-exporter",
        default=NODE_EXPORTER,
        help=f"node_exporter binary to compare with (default {NODE_EXPORTER})",
    )
    p.add_argument(
        "--work-dir",
        help="keep configs and process logs here (default: a temporary directory, removed)",
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="after the measured windows, record the exporter with py-spy into DIR",
    )


def run(args: argparse.Namespace) -> int:
    """Run the chosen sections, print the table, write the JSON report."""
    from exporter.cli import configure_logging

    configure_logging("warn", "logfmt")
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        known = ",".join(SECTIONS)
        print(f"bench: --only: unknown section {unknown[0]!r}; known: {known}", file=sys.stderr)
        return EXIT_USAGE
    sizes = _sizes(args)
    with _work_dir(args.work_dir) as work:
        try:
            report = measure(
                sizes,
                sections,
                work,
                node_exporter=args.node_exporter,
                profile_dir=Path(args.profile).resolve() if args.profile else None,
            )
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return EXIT_FAILED
    report["command"] = " ".join(["python -m exporter_tooling", *sys.argv[1:]])
    print(render_table(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"bench: report written to {out}")
    return EXIT_OK


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = QUICK if args.quick else Sizes()
    if args.scrapes is not None:
        sizes = dataclasses.replace(sizes, scrapes=max(1, args.scrapes))
    if args.starts is not None:
        sizes = dataclasses.replace(sizes, starts=max(1, args.starts))
    return sizes


@contextlib.contextmanager
def _work_dir(given: str | None) -> Iterator[Path]:
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="inference-lifecycle-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
