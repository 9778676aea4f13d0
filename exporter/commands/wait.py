"""The ``wait`` subcommand: block until a server is ready, replacing hand-written curl loops.

Follows the daemon's ``/status``, or (standalone) probes the server itself with the project's
prober. Read-only: it never changes the daemon, the server or its config.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import datetime
from typing import Final
from urllib.parse import urlsplit

from exporter.base.units import format_duration
from exporter.commands.client import (
    DEFAULT_URL,
    EXIT_USAGE,
    StatusClient,
    WaitError,
    add_daemon_flags,
    find_target,
    shown_url,
)
from exporter.commands.text import (
    Display,
    Recent,
    change_line,
    eta_text,
    live_line,
    phase_label,
)
from exporter.commands.verdict import (
    EXIT_REACHED,
    EXIT_TIMEOUT,
    WANTED,
    Verdict,
    fail,
    judge,
)
from exporter.commands.wait_standalone import StandaloneWait
from exporter.config import parse_duration
from exporter.render.status_doc import StatusDoc, TargetDoc

log = logging.getLogger(__name__)

EXIT_INTERRUPTED: Final = 130
#: A daemon that stops answering mid-wait (restart, upgrade) gets this long to come back.
DAEMON_GRACE_SECONDS: Final = 10.0
#: A process that started this long before ``wait`` counts as new (``systemctl restart X &&
#: wait X``: the new process starts before ``wait`` does).
RESTART_WINDOW_SECONDS: Final = 10.0
#: Process start times come from /proc, counted from a boot time that moves with NTP (and
#: that older daemons read in whole seconds).
START_TIME_SLACK_SECONDS: Final = 1.0
#: Fresh snapshots an old process's failure or stall must hold for before it is believed:
#: one to see the restart's new process missing, one more for the daemon to find it.
OLD_VERDICT_SNAPSHOTS: Final = 2

EPILOG: Final = f"""modes:
  daemon      wait TARGET: follows the exporter's /status (--url, default {DEFAULT_URL})
  standalone  wait --health-url URL: probes the server itself, no exporter needed
              (CI scripts, Kubernetes hooks); --completion-url and --model add a
              real completion for --until serving; --pid PID fails fast if it exits

exit codes:
  0    the target reached the wanted phase (ready: ready or serving)
  1    the cold start failed or stalled (reason and last notable log lines printed);
       standalone: --pid exited, or the server stopped answering after it had answered
  2    usage error, unknown target (the known ones are listed), exporter unreachable,
       or a probe that cannot succeed (401/403, redirect, TLS)
  124  --timeout passed first (default 15m)
  130  interrupted (Ctrl-C)

On a terminal one live line shows phase, elapsed time, progress, GPU memory, read rate
and ETA; otherwise one line is printed per phase change. Stall detection needs the daemon.

daemon mode trusts only snapshots sampled after it started, so a state from before a
restart is never replayed (`systemctl restart X && wait X` is safe). A failure or stall of
a process that started more than 10s before the wait must hold for two fresh snapshots
(a restarted server's new process gets a tick to appear); ready needs a health probe made
after the wait started. --started-after TIME accepts only a process started at or after
TIME (Unix seconds or ISO-8601), for restarts that return before the old process is gone.

examples:
  inference-lifecycle-exporter wait sglang --timeout 20m
  inference-lifecycle-exporter wait --health-url http://127.0.0.1:30000/health \\
      --completion-url http://127.0.0.1:30000/v1/completions --model m --until serving
"""


# --- flags ----------------------------------------------------------------------------------


def _duration(text: str) -> float:
    """A flag's duration: "15m", "1m30s", or plain seconds ("900")."""
    try:
        return parse_duration(float(text) if text.replace(".", "", 1).isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _moment(text: str) -> float:
    """A flag's point in time: Unix seconds ("1738324800.5") or ISO-8601 (local without offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not Unix seconds or an ISO-8601 time (2025-01-31T12:00:00Z)"
        ) from None


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``wait``."""
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("target", nargs="?", help="target name in the exporter's config")
    p.add_argument(
        "--until",
        choices=sorted(WANTED),
        default="ready",
        help="ready: health answers OK; serving: a completion succeeded (default ready)",
    )
    p.add_argument("--timeout", type=_duration, default=900.0, help="give up after (default 15m)")
    p.add_argument("--interval", type=_duration, default=1.0, help="poll every (default 1s)")
    p.add_argument(
        "--started-after",
        type=_moment,
        default=None,
        metavar="TIME",
        help="daemon mode: accept only a process started at or after TIME "
        "(Unix seconds or ISO-8601, e.g. 2025-01-31T12:00:00Z)",
    )
    add_daemon_flags(p)
    alone = p.add_argument_group("standalone mode (no exporter)")
    alone.add_argument("--health-url", help="probe this readiness URL directly")
    alone.add_argument("--completion-url", help="OpenAI-compatible .../v1/completions URL")
    alone.add_argument("--model", help="model name sent in the completion request")
    alone.add_argument("--prompt", default="2+2=", help='completion prompt (default "2+2=")')
    alone.add_argument("--pid", type=int, help="fail as soon as this process exits")
    alone.add_argument("--api-key-file", help="file holding the server's API key (mode 600)")
    alone.add_argument("--api-key-env", help="environment variable holding the API key")
    alone.add_argument(
        "--probe-timeout", type=_duration, default=5.0, help="per-probe deadline (default 5s)"
    )


def run(args: argparse.Namespace) -> int:
    """Wait as the flags say; returns the exit code documented in ``--help``."""
    out = Display(sys.stdout)
    try:
        _check_flags(args)
        if args.health_url:
            return StandaloneWait(args, out).run()
        return _DaemonWait(args, out).run()
    except WaitError as exc:
        out.close()
        print(f"wait: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        out.close()
        return EXIT_INTERRUPTED


def _check_flags(args: argparse.Namespace) -> None:
    if bool(args.target) == bool(args.health_url):
        raise WaitError("name a TARGET (daemon mode) or pass --health-url (standalone), not both")
    if args.completion_url and not args.model:
        raise WaitError("--completion-url needs --model (the model name the server serves)")
    if args.health_url and args.until == "serving" and not args.completion_url:
        raise WaitError("--until serving in standalone mode needs --completion-url and --model")
    for flag in ("url", "health_url", "completion_url"):
        value = getattr(args, flag)
        if not value:
            continue
        name = f"--{flag.replace('_', '-')}: {shown_url(value)}"
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WaitError(f"{name}: needs http(s)://HOST[:PORT]")
        try:
            parts.port  # noqa: B018  (raises on a port that is not a number)
        except ValueError:
            raise WaitError(f"{name}: the port is not a number") from None
    if args.interval <= 0 or args.probe_timeout <= 0:
        raise WaitError("--interval and --probe-timeout must be above 0")


# --- daemon mode ----------------------------------------------------------------------------


class _ReadRate:
    """Bytes per second of the process tree's reads, between two status documents."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None
        self.rate: float | None = None

    def update(self, taken_at: float | None, doc: TargetDoc) -> float | None:
        process = doc["process"]
        read = process["read_bytes"] if process is not None else None
        if taken_at is None or read is None:
            self._last, self.rate = None, None
            return None
        if self._last is not None and taken_at > self._last[0] and read >= self._last[1]:
            self.rate = (read - self._last[1]) / (taken_at - self._last[0])
        self._last = (taken_at, read)
        return self.rate


class Recency:
    """Whether a verdict in ``/status`` is about now, not replayed from before ``wait`` began.

    Right after ``systemctl restart X`` the daemon still shows the old process's ``ready`` or
    ``failed``, and keeps a ``failed`` until it finds the new process. So a verdict counts only
    from a snapshot sampled after ``asked_at``, and only for a process that started at or after
    ``started_after`` (default: ``RESTART_WINDOW_SECONDS`` before ``asked_at``, since the
    restarted process starts before ``wait`` does). Without ``--started-after`` an older
    process (a server already up, or dead, and not restarted) still gets its verdict: ready
    once a health probe made after ``asked_at`` answered OK, a failure or stall once it held
    for ``OLD_VERDICT_SNAPSHOTS`` fresh snapshots. Times are the daemon's epoch seconds: its
    host's clock and this one's must agree (the same host, or NTP).
    """

    def __init__(self, asked_at: float, started_after: float | None) -> None:
        self.asked_at = asked_at
        self.strict = started_after is not None
        after = started_after if started_after is not None else asked_at - RESTART_WINDOW_SECONDS
        self.bound = after - START_TIME_SLACK_SECONDS
        self._fresh: set[float] = set()

    def fresh(self, status: StatusDoc) -> bool:
        """True when the snapshot was sampled after ``asked_at`` (counted for old verdicts)."""
        taken = status.get("taken_at")
        sampled = status.get("sampled_at", taken)
        if taken is None or sampled is None or sampled < self.asked_at:
            return False
        self._fresh.add(taken)
        return True

    def withheld(self, status: StatusDoc, doc: TargetDoc, verdict: Verdict) -> str | None:
        """None when ``verdict`` may end the wait; otherwise why not yet (a short phrase)."""
        if not self.fresh(status):
            return "its snapshot is from before this wait"
        start = doc["started_at"] if doc["started_at"] is not None else doc["since"]
        if start is not None and start >= self.bound:
            return None
        if self.strict:
            return "its process started before --started-after"
        if verdict.code == EXIT_REACHED and _probed_ok_since(doc, self.asked_at):
            return None
        if len(self._fresh) >= OLD_VERDICT_SNAPSHOTS:
            return None
        return "its process started before this wait"


def _probed_ok_since(doc: TargetDoc, at: float) -> bool:
    health = doc["probes"]["health"]
    return health is not None and health["outcome"] == "ok" and health["at"] >= at


class _DaemonWait:
    def __init__(self, args: argparse.Namespace, out: Display) -> None:
        self._args, self._out = args, out
        self._deadline = time.monotonic() + args.timeout
        self._shown: tuple[str, bool] | None = None
        self._rate = _ReadRate()
        self._recent = Recent()
        self._recency = Recency(time.time(), args.started_after)
        self._withheld: tuple[str, str] | None = None

    def run(self) -> int:
        client = StatusClient(self._args.url, ca_file=self._args.ca_file)
        try:
            return self._loop(client)
        finally:
            client.close()

    def _loop(self, client: StatusClient) -> int:
        lost_at: float | None = None
        doc: TargetDoc | None = None
        while True:
            try:
                status = client.fetch()
                lost_at = None
            except WaitError:
                lost_at = lost_at or time.monotonic()
                # The first contact must work; later, give a restarting exporter a moment.
                if doc is None or time.monotonic() - lost_at > DAEMON_GRACE_SECONDS:
                    raise
                status = None
            if status is not None:
                doc = find_target(status, self._args.target) or doc
                verdict = self._show(status, doc)
                if verdict is not None:
                    return self._finish(verdict, doc)
            if time.monotonic() >= self._deadline:
                return self._timed_out(doc)
            time.sleep(max(0.0, min(self._args.interval, self._deadline - time.monotonic())))

    def _show(self, status: StatusDoc, doc: TargetDoc | None) -> Verdict | None:
        if doc is None:
            self._out.live(f"{self._args.target}: waiting for the exporter's first sample")
            return None
        key = (doc["phase"], doc["stalled"])
        if key != self._shown:
            self._shown = key
            self._out.line(change_line(doc))
        rate = self._rate.update(status.get("taken_at"), doc)
        self._recent.add(doc, rate)
        self._out.live(live_line(doc, rate, unicode=self._out.unicode, recent=self._recent))
        verdict = judge(doc, self._args.until)
        why = self._recency.withheld(status, doc, verdict) if verdict is not None else None
        if why is None:
            return verdict
        if (doc["phase"], why) != self._withheld:  # one line per reason, not one per poll
            self._withheld = (doc["phase"], why)
            self._out.line(f"{doc['target']} {phase_label(doc)}: not trusted yet, {why}")
        return None

    def _finish(self, verdict: Verdict, doc: TargetDoc | None) -> int:
        if verdict.code != EXIT_REACHED:
            return fail(self._out, verdict, doc)
        self._out.line(verdict.summary)
        return verdict.code

    def _timed_out(self, doc: TargetDoc | None) -> int:
        name, waited = self._args.target, format_duration(self._args.timeout)
        if doc is None:
            summary = f"{name}: timed out after {waited}; the exporter never sampled it"
        else:
            ratio = doc["progress_ratio"]
            where = f"{phase_label(doc)}" + (f" at {ratio:.0%}" if ratio is not None else "")
            summary = f"{name}: timed out after {waited} waiting for {self._args.until}; {where}"
            if doc["phase"] == "ready" and self._args.until == "serving":
                summary += " (no completion succeeded: is [target.completion] configured?)"
            elif eta := eta_text(doc):
                summary += f" ({eta})"
        return fail(self._out, Verdict(EXIT_TIMEOUT, summary), doc)
