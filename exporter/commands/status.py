"""The ``status`` subcommand: one table of every target the exporter watches.

Reads the daemon's ``/status`` once and prints; it changes nothing and keeps no state.
With ``--watch`` it redraws the table every few seconds, with sparklines of each target's
GPU memory and read rate over its last ticks (from ``/trail``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Final

from exporter.base.controls import escape_controls
from exporter.base.model import STARTUP_PHASES
from exporter.base.units import format_duration
from exporter.commands.bounds import bound_line
from exporter.commands.client import (
    EXIT_USAGE,
    StatusClient,
    WaitError,
    add_daemon_flags,
    shown_url,
)
from exporter.commands.text import phase_label, sparkline
from exporter.render.status_doc import ColdStartDoc, StatusDoc, TargetDoc

EXIT_OK: Final = 0
_STARTUP: Final = frozenset(p.value for p in STARTUP_PHASES)
COLUMNS: Final = (
    "TARGET",
    "ENGINE",
    "PHASE",
    "SINCE",
    "PROGRESS",
    "ETA",
    "STALL",
    "LAST COLD START",
    "DURATION",
)
EPILOG: Final = """columns:
  SINCE            how long the target has been in its phase
  STALL            seconds without progress evidence; "STALLED" once past the threshold
  LAST COLD START  when the last finished cold start began, and how it ended
  DURATION         how long that cold start took (process start to ready or failure)

exit codes:
  0  the table was printed
  2  usage error, or the exporter cannot be reached (the message says what to try)
"""


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``status``."""
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_daemon_flags(p)
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        default=None,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) with GPU memory and read-rate sparklines, "
        "until Ctrl-C",
    )


def run(args: argparse.Namespace) -> int:
    """Print the table (or keep redrawing it); exit codes as in ``--help``."""
    try:
        client = StatusClient(args.url, ca_file=args.ca_file)
    except WaitError as exc:
        print(f"status: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.watch is not None:
            return _watch(client, args)
        doc = client.fetch()
    except WaitError as exc:
        print(f"status: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.close()
    print(render_table(doc, source=shown_url(args.url)), end="")
    return EXIT_OK


def _watch(client: StatusClient, args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    unicode = (sys.stdout.encoding or "").lower().startswith("utf")
    try:
        while True:
            table = render_table(
                client.fetch(),
                source=shown_url(args.url),
                trails=client.fetch_trail(),
                unicode=unicode,
            )
            print(("\x1b[H\x1b[2J" if tty else "\n") + table, end="", flush=True)
            time.sleep(max(0.2, args.watch))
    except KeyboardInterrupt:
        return EXIT_OK


def render_table(
    doc: StatusDoc,
    *,
    source: str = "",
    now: float | None = None,
    trails: Mapping[str, Sequence[tuple[float | None, float | None]]] | None = None,
    unicode: bool = True,
) -> str:
    """The status document as an aligned text table, one row per target.

    With ``trails`` (``StatusClient.fetch_trail``) two more columns show each target's GPU
    memory and read rate over its last ticks as sparklines.
    """
    if not doc["ready"]:
        return f"{source or 'the exporter'} has not sampled its targets yet\n"
    if not doc["targets"]:
        return "no targets configured\n"
    now = now if now is not None else doc.get("taken_at") or time.time()
    if trails is None:
        return _align([COLUMNS, *(target_row(t, now) for t in doc["targets"])]) + _advice(doc)
    rows = [
        (*target_row(t, now), *_sparks(trails.get(t["target"], ()), unicode))
        for t in doc["targets"]
    ]
    return _align([(*COLUMNS, "GPU MEMORY", "READ"), *rows]) + _advice(doc)


def _advice(doc: StatusDoc) -> str:
    """Under the table, per target, what bounds its start (or bounded the last one)."""
    lines = [(t["target"], bound_line(t)) for t in doc["targets"]]
    return "".join(f"{name}: {line}\n" for name, line in lines if line)


def _sparks(points: Sequence[tuple[float | None, float | None]], unicode: bool) -> tuple[str, str]:
    gpu = sparkline([g for g, _ in points], unicode=unicode) or "-"
    read = sparkline([r for _, r in points], unicode=unicode) or "-"
    return gpu, read


def target_row(t: TargetDoc, now: float) -> tuple[str, ...]:
    """One target's cells, in ``COLUMNS`` order."""
    ratio = t["progress_ratio"]
    cells = (
        t["target"],
        t["engine"] or "-",
        phase_label(t),
        format_duration(t["phase_seconds"]),
        f"{ratio:.0%}" if ratio is not None else "-",
        format_duration(t["eta_seconds"]),
        _stall(t),
        *_last_start(t["last_cold_start"], now),
    )
    # Names and reasons come from pods, labels and engines: nothing in them may steer the
    # terminal or break the table's lines.
    return tuple(escape_controls(cell) for cell in cells)


def _stall(t: TargetDoc) -> str:
    if t["stalled"]:
        return f"STALLED {format_duration(t['seconds_since_progress'])}"
    if t["phase"] not in _STARTUP:
        return "-"  # a down or serving server makes no start progress to be quiet about
    quiet = t["seconds_since_progress"]
    return f"quiet {format_duration(quiet)}" if quiet is not None and quiet >= 10 else "-"


def _last_start(cold: ColdStartDoc | None, now: float) -> tuple[str, str]:
    if not cold:
        return "-", "-"
    ago = format_duration(now - cold["started_at"])
    outcome = cold["outcome"] + (f" ({cold['reason']})" if cold["reason"] else "")
    return f"{ago} ago, {outcome}", format_duration(cold["duration_seconds"])


def _align(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"
