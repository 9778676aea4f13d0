"""The ``simulate`` subcommand: a real process tree and HTTP server that cold-starts like an engine.

It powers the demo and the end-to-end tests. It never imports the exporter's sources or core: it is
the thing being watched, not the watcher.
"""

from __future__ import annotations

import argparse
import signal
import sys
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import TextIO

from exporter.simulate.coldstart import ColdStart, SimulatorError
from exporter.simulate.plan import Scenario, SimConfig, SimEngine

_EPILOG = """\
exit codes:
  0  stopped by SIGTERM or SIGINT
  1  the simulated start failed (crash-loading, oom-initializing, a worker died)
  2  bad flags, port taken, or a file that cannot be written

When it becomes ready it prints one line on stdout:
  SIMULATOR ready_at=<unix time> pid=<pid>
"""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``simulate`` flags to ``parser``."""
    parser.description = "Run a simulated LLM inference engine that cold-starts like a real one."
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--port", type=_port, required=True, help="HTTP port of the simulated engine")
    add("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    add(
        "--engine",
        choices=[e.value for e in SimEngine],
        default=SimEngine.SGLANG.value,
        help="engine to imitate: log format and HTTP semantics (default: %(default)s)",
    )
    add(
        "--weights-mb",
        type=_positive_int,
        default=640,
        help="size of the weight files to create and read, MiB (default: %(default)s)",
    )
    add(
        "--read-mbps",
        type=_positive_float,
        default=25.0,
        help="weight read rate, MiB/s (default: %(default)s)",
    )
    add(
        "--start-seconds",
        type=_non_negative_float,
        default=5.0,
        help="length of the starting phase (default: %(default)s)",
    )
    add(
        "--init-seconds",
        type=_non_negative_float,
        default=20.0,
        help="length of the initializing phase (default: %(default)s)",
    )
    add(
        "--scenario",
        choices=[s.value for s in Scenario],
        default=Scenario.HEALTHY.value,
        help="how the start goes (default: %(default)s)",
    )
    add(
        "--flap-seconds",
        type=_positive_float,
        default=3.0,
        help="flap scenario: length of each healthy and failing stretch (default: %(default)s)",
    )
    add(
        "--gpus",
        type=_gpu_count,
        default=1,
        help="simulated GPUs, one worker process each (default: %(default)s)",
    )
    add("--gpu-state-file", type=Path, help="publish simulated GPU state here (fake NVML reads it)")
    add("--log-file", type=Path, help="append engine log lines here (default: stderr)")
    add("--pid-file", type=Path, help="write the main pid here at start")
    add("--work-dir", type=Path, help="create the weight files here (default: a temporary dir)")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The validated settings of parsed ``simulate`` flags."""
    return SimConfig(
        port=args.port,
        host=args.host,
        engine=SimEngine(args.engine),
        weights_mb=args.weights_mb,
        read_mbps=args.read_mbps,
        start_seconds=args.start_seconds,
        init_seconds=args.init_seconds,
        scenario=Scenario(args.scenario),
        gpus=args.gpus,
        flap_seconds=args.flap_seconds,
        log_file=args.log_file,
        pid_file=args.pid_file,
        gpu_state_file=args.gpu_state_file,
        work_dir=args.work_dir,
    )


def run(args: argparse.Namespace) -> int:
    """Run the simulated engine until it fails or SIGTERM/SIGINT; returns the exit code."""
    cfg = config_from_args(args)
    with ExitStack() as stack:
        try:
            log_stream = _open_log(cfg.log_file, stack)
        except OSError as exc:
            print(
                f"simulate: --log-file: cannot open {cfg.log_file}: {exc.strerror}", file=sys.stderr
            )
            return 2
        sim = ColdStart(cfg, log_stream, sys.stdout)
        stack.callback(_restore_signals, _stop_on_signals(sim))
        try:
            return sim.run()
        except SimulatorError as exc:
            print(f"simulate: {exc}", file=sys.stderr)
            return 2
    return 2  # unreachable: ExitStack does not swallow exceptions


def main(argv: list[str] | None = None) -> int:
    """``python -m exporter.simulate``: the subcommand without the CLI around it."""
    parser = argparse.ArgumentParser(prog="inference-lifecycle-exporter simulate")
    configure_parser(parser)
    return run(parser.parse_args(argv))


def _open_log(path: Path | None, stack: ExitStack) -> TextIO:
    if path is None:
        return sys.stderr
    return stack.enter_context(path.open("a", encoding="utf-8"))


Handlers = dict[int, object]


def _stop_on_signals(sim: ColdStart) -> Handlers:
    def stop(signum: int, frame: FrameType | None) -> None:
        sim.stop()

    return {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore_signals(previous: Handlers) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 1-65535, got {text!r}")
    return value


def _gpu_count(text: str) -> int:
    value = _positive_int(text)
    if value > 16:
        raise argparse.ArgumentTypeError(f"must be 1-16, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value
