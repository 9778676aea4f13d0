"""The ``probe`` subcommand: a Kubernetes exec probe that knows a slow load from a hang.

Asks the exporter's ``/probe?target=NAME`` once: exit 0 while the target's start progresses
or it is up, 1 once it is stalled, failed, down or degraded, 2 when it cannot tell (usage,
an unknown target, an unreachable exporter). A startupProbe built on it fails within a tick
of a hang instead of after a window sized for the slowest start.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

from exporter.base.controls import escape_controls
from exporter.commands.client import EXIT_USAGE, StatusClient, WaitError, add_daemon_flags

EXIT_OK: Final = 0
EXIT_FAILING: Final = 1
EPILOG: Final = """exit codes:
  0  the target's start progresses, or it is ready, serving or sleeping
  1  it is stalled, failed, down or degraded (the line says why)
  2  usage error, unknown target, or the exporter cannot be reached
"""


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``probe``."""
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("target", help="target name in the exporter's config (or discovered)")
    add_daemon_flags(p)


def run(args: argparse.Namespace) -> int:
    """Ask once; exit codes as in ``--help``."""
    try:
        client = StatusClient(args.url, ca_file=args.ca_file, timeout=3.0)
    except WaitError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        status, line = client.probe(args.target)
    except WaitError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.close()
    print(escape_controls(line))  # the target's name and reason come from others
    if status == 200:
        return EXIT_OK
    return EXIT_FAILING if status == 503 else EXIT_USAGE
