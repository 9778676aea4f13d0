"""``python -m exporter_tooling COMMAND``: the demo, the simulator and the bench.

Run from a checkout (the product's wheel does not ship the tooling); the subcommands keep the
product CLI's shape, its parser and its handling of SIGINT and SIGTERM.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

from exporter.cli import EXIT_USAGE, build_parser, run_command

#: Subcommand -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: Final = {
    "demo": ("exporter_tooling.demo", "run the exporter against a simulated cold-starting engine"),
    "simulate": ("exporter_tooling.simulate", "run a simulated cold-starting inference engine"),
    "bench": (
        "exporter_tooling.bench.command",
        "measure scrape latency, sampling cost and detection time",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the tooling's command line and run the subcommand; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(
        args_list[0] if args_list else None,
        commands=COMMANDS,
        prog="python -m exporter_tooling",
        description="The exporter's tooling: a demo, a simulated engine, the benchmark.",
    )
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    return run_command(COMMANDS[args.command][0], args)


if __name__ == "__main__":
    raise SystemExit(main())
