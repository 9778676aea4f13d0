"""``record`` writes each tick's observations to a trace; ``replay`` runs one through the core.

Operators tune thresholds on their own real cold starts this way. Recording uses an in-memory
history, so a trace replays from a fresh state and reproduces the live timeline exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from exporter.base.model import Observation
from exporter.core.lifecycle import TargetState, Thresholds, initial_state, step
from exporter.render.status import transition_json
from exporter.trace import (
    TRACE_VERSION,
    observation_from_json,
    observation_to_json,
    thresholds_from_json,
    thresholds_to_json,
)

EPILOG = """exit codes:
  0  done
  1  the trace's recorded live timeline differs from the replayed one (replay)
  2  usage error, unreadable config or trace (one line naming file and line)
"""


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``record`` and ``replay`` (the same module serves both)."""
    p.epilog = EPILOG
    p.add_argument("trace", nargs="?", help="replay: the JSONL trace to replay")
    p.add_argument("--config.file", dest="config_file", help="record: the exporter config")
    p.add_argument("--out", help="record: where to write the trace (JSONL)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="record: stop after this many seconds (default: until SIGINT/SIGTERM)",
    )
    p.add_argument("--json", action="store_true", help="replay: print one JSON document")


def run(args: argparse.Namespace) -> int:
    """Dispatch on whether a trace was given (replay) or an output file (record)."""
    if args.out:
        return record(args)
    if args.trace:
        return replay_command(args)
    print("record needs --config.file and --out; replay needs a TRACE file", file=sys.stderr)
    return 2


# --- record ---------------------------------------------------------------------------------


def record(args: argparse.Namespace) -> int:
    """Run the daemon's sampling loop (no web server) and write each observation."""
    from exporter.base.errors import ConfigErrors
    from exporter.cli import configure_logging
    from exporter.config import load_settings
    from exporter.daemon import Daemon
    from exporter.history import History

    configure_logging("info", "logfmt")
    if not args.config_file:
        print("record: --config.file is required", file=sys.stderr)
        return 2
    try:
        settings = load_settings(args.config_file)
    except ConfigErrors as exc:
        print(exc, file=sys.stderr)
        return 2
    stop = threading.Event()
    with open(args.out, "w", encoding="utf-8") as out:
        _write(
            out,
            {
                "kind": "header",
                "version": TRACE_VERSION,
                "targets": [t.name for t in settings.targets],
                "recorded_at": time.time(),
            },
        )

        def on_step(obs: Observation, now: float, th: Thresholds) -> None:
            _write(
                out,
                {
                    "kind": "tick",
                    "now": now,
                    "thresholds": thresholds_to_json(th),
                    "observation": observation_to_json(obs),
                },
            )

        daemon = Daemon(settings, history=History.open(None), on_step=on_step)
        if args.duration is not None:
            threading.Timer(args.duration, stop.set).start()
        _stop_on_signals(stop)
        try:
            daemon.run(stop)
        finally:
            daemon.close()
            for snap_target in daemon.latest.targets if daemon.latest else ():
                _write(
                    out,
                    {
                        "kind": "timeline",
                        "target": snap_target.info.name,
                        "transitions": [transition_json(t) for t in snap_target.state.transitions],
                    },
                )
    return 0


def _stop_on_signals(stop: threading.Event) -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


def _write(out: IO[str], doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc, separators=(",", ":")) + "\n")
    out.flush()


# --- replay ---------------------------------------------------------------------------------


@dataclass
class Replay:
    """Per target: the final state after replay, and the live timeline if the trace has one."""

    states: dict[str, TargetState] = field(default_factory=dict)
    recorded: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def matches(self) -> bool:
        """True when every recorded live timeline equals the replayed one."""
        return all(
            [transition_json(t) for t in self.states[name].transitions] == timeline
            for name, timeline in self.recorded.items()
            if name in self.states
        )


def read_trace(lines: Iterable[str], name: str) -> Iterator[dict[str, Any]]:
    """Parse a trace's lines.

    Raises:
        ValueError: a line is not JSON, naming the file and line number.
    """
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}:{number}: not JSON: {exc.msg}") from exc


def replay(docs: Iterable[dict[str, Any]]) -> Replay:
    """Run a trace's ticks through the lifecycle core."""
    result = Replay()
    for doc in docs:
        if doc.get("kind") == "tick":
            obs = observation_from_json(doc["observation"])
            prev = result.states.get(obs.target) or initial_state(obs.target)
            result.states[obs.target] = step(
                prev, obs, float(doc["now"]), thresholds_from_json(doc["thresholds"])
            )
        elif doc.get("kind") == "timeline":
            result.recorded[doc["target"]] = doc["transitions"]
    return result


def replay_command(args: argparse.Namespace) -> int:
    """Print the replayed timeline per target, and whether it matches the live one."""
    path = Path(args.trace)
    try:
        with path.open(encoding="utf-8") as f:
            result = replay(read_trace(f, str(path)))
    except (OSError, ValueError, KeyError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "targets": {
                        n: {
                            "phase": s.phase.value,
                            "failure_reason": s.failure_reason,
                            "transitions": [transition_json(t) for t in s.transitions],
                        }
                        for n, s in result.states.items()
                    },
                    "matches_recorded": result.matches() if result.recorded else None,
                }
            )
        )
    else:
        for name, state in result.states.items():
            print(
                f"{name}: {state.phase}"
                + (f" ({state.failure_reason})" if state.failure_reason else "")
            )
            for t in state.transitions:
                stamp = datetime.fromtimestamp(t.at, UTC).strftime("%H:%M:%S.%f")[:-3]
                print(f"  {stamp}  {t.from_phase:>12} -> {t.to_phase:<12} {t.reason}")
        if result.recorded:
            print("matches the recorded live timeline: " + ("yes" if result.matches() else "NO"))
    return 0 if not result.recorded or result.matches() else 1
