"""The ``simulate`` subcommand: a real process tree and HTTP server that cold-starts like an engine.

It powers the demo and the end-to-end tests. It never imports the exporter's sources or core: it is
the thing being watched, not the watcher.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import TextIO

from exporter_tooling.simulate.coldstart import ColdStart, SimulatorError
from exporter_tooling.simulate.plan import Scenario, SimConfig, SimEngine

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
    parser.add_argument("--port", type=_port, required=True, help="HTTP port of the engine")
    parser.add_argument("--host", default=_DEFAULTS.host, help="address to bind (%(default)s)")
    parser.add_argument(
        "--gpu-name",
        default=_DEFAULTS.gpu_name,
        help="model name of the simulated GPUs, without spaces (%(default)s)",
    )
    parser.add_argument(
        "--engine",
        choices=[e.value for e in SimEngine],
        default=_DEFAULTS.engine.value,
        help="engine to imitate: log format and HTTP semantics (%(default)s)",
    )
    parser.add_argument(
        "--scenario",
        choices=[s.value for s in Scenario],
        default=_DEFAULTS.scenario.value,
        help="how the start goes (%(default)s)",
    )
    for flag, kind, help_text in _NUMBER_FLAGS:
        default = getattr(_DEFAULTS, flag[2:].replace("-", "_"))
        parser.add_argument(flag, type=kind, default=default, help=f"{help_text} (%(default)s)")
    for flag, help_text in _PATH_FLAGS:
        parser.add_argument(flag, type=Path, help=help_text)


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
        gpu_name=args.gpu_name,
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
    """``python -m exporter_tooling.simulate``: the subcommand without the CLI around it."""
    parser = argparse.ArgumentParser(prog="python -m exporter_tooling simulate")
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
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
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


_DEFAULTS = SimConfig(port=1)
_NUMBER_FLAGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("--weights-mb", _positive_int, "size of the weight files to create and read, MiB"),
    ("--read-mbps", _positive_float, "weight read rate of all workers together, MiB/s"),
    ("--start-seconds", _non_negative_float, "length of the starting phase"),
    ("--init-seconds", _non_negative_float, "length of the initializing phase"),
    ("--flap-seconds", _positive_float, "flap and sleep-wake scenarios: each stretch"),
    ("--gpus", _gpu_count, "simulated GPUs, one worker process each"),
)
_PATH_FLAGS = (
    ("--gpu-state-file", "publish simulated GPU state here (the fake libnvidia-ml reads it)"),
    ("--log-file", "append engine log lines here (default: stderr)"),
    ("--pid-file", "write the main pid here at start"),
    ("--work-dir", "create the weight files here (default: a fresh temporary directory)"),
)
