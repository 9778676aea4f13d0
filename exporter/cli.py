"""Command line: parse arguments, configure logging, build the daemon and hand over.

Subcommands live in their own modules, each exposing ``configure_parser`` and ``run``; this
module only dispatches. It is the one place that configures logging handlers.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Final

from exporter import __version__
from exporter.base.controls import escape_controls
from exporter.base.errors import ConfigError, ConfigErrors, ExporterError

if TYPE_CHECKING:  # imported lazily at run time: --help and wait start fast
    from exporter.config import Settings

log = logging.getLogger(__name__)

EXIT_OK: Final = 0
EXIT_RUNTIME: Final = 1
EXIT_USAGE: Final = 2
#: 128 + SIGINT, as a shell reports a command stopped by Ctrl-C.
EXIT_INTERRUPTED: Final = 130

#: Subcommand -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "run": ("exporter.cli", "run the exporter daemon (the default)"),
    "check-config": ("exporter.cli", "validate a config file and exit"),
    "record": ("exporter.commands.replay", "record observations per tick to a JSONL trace"),
    "replay": ("exporter.commands.replay", "replay a recorded trace through the lifecycle core"),
    "replay-log": (
        "exporter.commands.replay_log",
        "replay an engine log file through the classifier",
    ),
    "wait": ("exporter.commands.wait", "wait until a target is ready (replaces curl loops)"),
    "status": ("exporter.commands.status", "print a table of every target's phase and progress"),
    "probe": (
        "exporter.commands.probe",
        "exit 0 while a target's start progresses or it is up (a Kubernetes exec probe)",
    ),
}

RUN_EPILOG: Final = """exit codes:
  0  stopped cleanly (SIGTERM or SIGINT)
  1  runtime failure (cannot bind the listen address, ...)
  2  usage or config error (one line per problem: file, field, reason)
"""


class _LogfmtFormatter(logging.Formatter):
    def __init__(self, with_time: bool) -> None:
        super().__init__()
        self._with_time = with_time

    def format(self, record: logging.LogRecord) -> str:
        head = f"level={record.levelname.lower()} logger={record.name} msg="
        if self._with_time:
            head = f"ts={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} " + head
        # A name or an engine's text with a newline in it must not forge a line of our own.
        text = escape_controls(record.getMessage())
        line = head + (json.dumps(text) if " " in text.split(" ", 1)[0] else text)
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def configure_logging(level: str, fmt: str) -> None:
    """Configure the root logger; timestamps are left out under systemd (journald adds them)."""
    import os

    handler = logging.StreamHandler(sys.stderr)
    under_journal = bool(os.environ.get("JOURNAL_STREAM"))
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _LogfmtFormatter(not under_journal))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request (with its URL) at INFO: per-tick noise, and URLs are not ours
    # to log; the prober reports outcomes itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)


def add_web_and_log_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``run`` and ``demo``, named as Prometheus exporters name them."""
    p.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=":10049",
        help="address to listen on for /metrics, /status and the page (default :10049)",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default=None,
        help="exporter-toolkit web config (TLS, basic auth, headers)",
    )
    add_log_flags(p)


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """``--log.level`` and ``--log.format``."""
    p.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=["debug", "info", "warn", "error"],
        help="log level (default info)",
    )
    p.add_argument(
        "--log.format",
        dest="log_format",
        default="logfmt",
        choices=["logfmt", "json"],
        help="log format (default logfmt)",
    )


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``run``."""
    p.add_argument(
        "--config.file",
        dest="config_file",
        default="/etc/inference-lifecycle-exporter/config.toml",
        help="TOML config file (default /etc/inference-lifecycle-exporter/config.toml)",
    )
    add_web_and_log_flags(p)


def _configure_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config.file", dest="config_file", required=True, help="TOML config file")
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default=None,
        help="also validate this exporter-toolkit web config",
    )


def build_parser(
    command: str | None = None,
    *,
    commands: Mapping[str, tuple[str, str]] = COMMANDS,
    prog: str = "inference-lifecycle-exporter",
    description: str = "Watches LLM inference servers through their cold starts and exports "
    "phase, progress, stall and readiness as Prometheus metrics.",
) -> argparse.ArgumentParser:
    """The argument parser; only ``command``'s module is imported to configure its flags.

    ``commands`` is the product's table by default; the tooling's entry point passes its own.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=__version__)
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in commands.items():
        sub = subs.add_parser(
            name,
            help=help_,
            description=help_,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=RUN_EPILOG if name in ("run", "check-config") else None,
        )
        if name != command:
            continue
        if name == "run":
            configure_parser(sub)
        elif name == "check-config":
            _configure_check(sub)
        else:
            importlib.import_module(module).configure_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (
        args_list[0].startswith("-") and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list.insert(0, "run")  # `run` is the default subcommand
    # Before anything slow (imports, the config, the first tick): a SIGHUP sent as soon as
    # the process exists (a config tool's reload after starting it) must not kill it.
    signals = _install_signals() if args_list and args_list[0] == "run" else None
    parser = build_parser(args_list[0] if args_list else None)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "run":
        return run(args, signals)
    if args.command == "check-config":
        return check_config(args)
    return run_command(COMMANDS[args.command][0], args)


def run_command(module_name: str, args: argparse.Namespace) -> int:
    """Run a subcommand module's ``run(args)``, stoppable by SIGINT and SIGTERM."""
    module = importlib.import_module(module_name)
    with _interruptible():
        try:
            result: int = module.run(args)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    return result


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt``, whatever the parent left them as.

    A shell starts a background job (``cmd &`` in a script, ``nohup``) with SIGINT ignored,
    and Python then installs no handler of its own: ``status --watch`` or ``wait`` would never
    stop. Commands that stop in their own way (``record``, ``simulate``, ``demo``) install
    their own handlers inside this. The previous handlers come back afterwards (``main`` also
    runs inside tests).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in kept:
        signal.signal(sig, signal.default_int_handler)
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def config_problems(
    args: argparse.Namespace, *, environment: bool = False
) -> tuple[Settings | None, list[str]]:
    """Load the config and check everything ``run`` needs before it starts.

    ``check-config`` and ``run`` share this, so whatever ``run`` refuses, ``check-config``
    refuses first, with the same one line per problem: the TOML, each API key file, the
    Kubernetes credentials, a Docker socket path that is no socket, the web config (TLS
    files, users, headers). With ``environment`` (``check-config``) also what ``run``
    survives but an operator should hear of, e.g. an unwritable state directory (``run`` then
    keeps history in memory) or a Docker socket not there yet (``run`` waits for it).

    Returns:
        The settings (None when the TOML itself failed) and the problems found.
    """
    from exporter.config import check_environment, load_settings
    from exporter.config.keys import load_api_key
    from exporter.web.config import validate_web_config

    problems: list[str] = []
    try:
        settings = load_settings(args.config_file)
    except ConfigErrors as exc:
        problems.extend(str(e) for e in exc.errors)
        settings = None
    problems.extend(
        str(e) for e in (check_environment(settings) if settings and environment else ())
    )
    for target in settings.targets if settings else ():
        try:
            load_api_key(target)
        except ConfigError as exc:
            problems.append(str(exc))
    if settings is not None and settings.kubernetes is not None:
        from exporter.discovery.kubernetes import load_credentials

        try:
            load_credentials(settings.kubernetes, settings.source_path)
        except ConfigError as exc:
            problems.append(str(exc))
    if settings is not None and settings.docker is not None:
        from exporter.discovery.docker import socket_problem

        if problem := socket_problem(settings.docker, settings.source_path, environment):
            problems.append(problem)
    if args.web_config_file:
        try:
            validate_web_config(args.web_config_file)
        except ConfigError as exc:
            problems.append(str(exc))
    return settings, problems


def check_config(args: argparse.Namespace) -> int:
    """Validate a config file (and web config): one line per problem on stderr, exit 2."""
    settings, problems = config_problems(args, environment=True)
    for line in problems:
        print(line, file=sys.stderr)
    if problems or settings is None:
        return EXIT_USAGE
    found = f", pods of node {k.node_name}" if (k := settings.kubernetes) else ""
    found += f", containers on {d.socket}" if (d := settings.docker) else ""
    count = len(settings.targets)
    print(f"{args.config_file}: OK ({count} target{'' if count == 1 else 's'}{found})")
    return EXIT_OK


def run(args: argparse.Namespace, signals: Signals | None = None) -> int:
    """Run the daemon until SIGTERM or SIGINT; SIGHUP reloads the config."""
    configure_logging(args.log_level, args.log_format)
    settings, problems = config_problems(args)
    for line in problems:
        print(line, file=sys.stderr)
    if problems or settings is None:
        return EXIT_USAGE
    return serve(settings, args.listen_address, args.web_config_file, signals=signals)


def serve(
    settings: object,
    listen_address: str,
    web_config_file: str | None,
    *,
    stop: threading.Event | None = None,
    gpu_env: dict[str, str] | None = None,
    on_first_tick: Callable[[], None] | None = None,
    signals: Signals | None = None,
) -> int:
    """Build the daemon and web server, run until stopped; shared by ``run`` and ``demo``.

    ``signals`` are the events handlers installed already set; else they are installed once
    the web server listens.
    """
    from prometheus_client import CollectorRegistry

    from exporter.config import Settings, load_settings
    from exporter.daemon import Daemon
    from exporter.render.metrics import SnapshotCollector
    from exporter.render.page import page_csp, render_page
    from exporter.render.status import probe_answer, status_json
    from exporter.render.trail import trail_json
    from exporter.web.server import WebRoutes, WebServer

    assert isinstance(settings, Settings)
    if signals is not None:
        stop = signals.stop
    stop = stop or threading.Event()
    try:
        daemon = Daemon(settings, gpu_env=gpu_env)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: daemon.latest, __version__))
    routes = WebRoutes(
        registry=registry,
        status=lambda: status_json(daemon.latest),
        trail=lambda: trail_json(daemon.latest),
        probe=lambda name: probe_answer(daemon.latest, name),
        page=lambda: render_page(daemon.latest),
        page_csp=page_csp(),
        ready=lambda: daemon.latest is not None,
        metrics_key=lambda: daemon.latest,
    )
    server = WebServer(routes, listen_address=listen_address, web_config_file=web_config_file)
    try:
        server.start()
    except ExporterError as exc:
        log.error("%s", exc)
        daemon.close()
        return EXIT_RUNTIME
    reload = (signals or _install_signals(stop)).reload
    log.info(
        "started version=%s listen=%s targets=%s interval_s=%g state_dir=%s",
        __version__,
        listen_address,
        ",".join(t.name for t in settings.targets) or "-",
        settings.interval_seconds,
        settings.state_directory,
    )
    started = time.monotonic()
    # What start-up made (modules, engine profiles, compiled patterns: most of the heap)
    # lives as long as the process: leave it out of every later garbage collection.
    gc.freeze()
    try:
        daemon.run(
            stop,
            reload=reload,
            load=lambda: load_settings(settings.source_path),
            on_first_tick=on_first_tick,
        )
    finally:
        server.stop()
        daemon.close()
        log.info("stopped after_s=%.0f", time.monotonic() - started)
    if daemon.stuck_sources:
        # Python joins pool threads at exit; one stuck in a syscall would hang SIGTERM forever.
        log.warning("exiting with source calls still stuck count=%d", daemon.stuck_sources)
        logging.shutdown()
        os._exit(EXIT_OK)
    return EXIT_OK


@dataclass(frozen=True, slots=True)
class Signals:
    """What SIGTERM/SIGINT (``stop``) and SIGHUP (``reload``) set."""

    stop: threading.Event
    reload: threading.Event


def _install_signals(stop: threading.Event | None = None) -> Signals:
    """Handlers that set the returned events (installed from the main thread only)."""
    signals = Signals(stop or threading.Event(), threading.Event())
    stop, reload = signals.stop, signals.reload
    if threading.current_thread() is not threading.main_thread():
        return signals

    def _reload(_signum: int, _frame: FrameType | None) -> None:
        log.info("signal received signal=SIGHUP, reloading config")
        reload.set()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal received signal=%s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, _reload)
    return signals
