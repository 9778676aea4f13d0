"""The ``wait`` subcommand: block until a server is ready, replacing hand-written curl loops.

Follows the daemon's ``/status``, or (standalone) probes the server itself with the project's
prober. Read-only: it never changes the daemon, the server or its config.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import ssl
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, TextIO
from urllib.parse import urlsplit, urlunsplit

import httpx

from exporter import __version__
from exporter.base.errors import ConfigError
from exporter.base.model import ProbeOutcome, ProbeResult
from exporter.base.units import format_bytes, format_duration
from exporter.config import CompletionProbe, Target, parse_duration
from exporter.render.status_doc import MalformedStatus, StatusDoc, TargetDoc, parse_status_doc
from exporter.sources.probe import Prober

log = logging.getLogger(__name__)

EXIT_REACHED: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_TIMEOUT: Final = 124
EXIT_INTERRUPTED: Final = 130
DEFAULT_URL: Final = "http://127.0.0.1:10049"
#: Standard OpenAI-compatible completion path; the prober appends it to a base URL.
COMPLETION_SUFFIX: Final = "/v1/completions"
#: A daemon that stops answering mid-wait (restart, upgrade) gets this long to come back.
DAEMON_GRACE_SECONDS: Final = 10.0
#: Refused connections in a row, after the server had answered, that mean it went away.
REFUSED_AFTER_ANSWER: Final = 2
NOTABLE_SHOWN: Final = 5
#: A process that started this long before ``wait`` counts as new (``systemctl restart X &&
#: wait X``: the new process starts before ``wait`` does).
RESTART_WINDOW_SECONDS: Final = 10.0
#: Process start times come from /proc, whose boot time has whole seconds.
START_TIME_SLACK_SECONDS: Final = 1.0
#: Fresh snapshots an old process's failure or stall must hold for before it is believed:
#: one to see the restart's new process missing, one more for the daemon to find it.
OLD_VERDICT_SNAPSHOTS: Final = 2
_WANTED: Final[Mapping[str, frozenset[str]]] = {
    "ready": frozenset({"ready", "serving"}),
    "serving": frozenset({"serving"}),
}
#: Probe outcomes no amount of waiting fixes: the flags or the key are wrong.
_FATAL_PROBE: Final[Mapping[ProbeOutcome, str]] = {
    ProbeOutcome.UNAUTHORIZED: "answered 401/403: pass --api-key-file or --api-key-env",
    ProbeOutcome.REDIRECT: "answered a redirect: pass the final URL",
    ProbeOutcome.TLS: "TLS handshake failed: check the scheme, or pass --ca-file",
}

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


class WaitError(Exception):
    """Waiting cannot even begin or continue: bad flags, unreachable exporter (exit 2)."""


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


def add_daemon_flags(p: argparse.ArgumentParser) -> None:
    """``--url`` and ``--ca-file``: where the exporter's ``/status`` is (shared with ``status``)."""
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the exporter's address (default {DEFAULT_URL}); basic auth as https://user:pw@host",
    )
    p.add_argument("--ca-file", default=None, help="CA bundle for an https exporter or server")


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``wait``."""
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("target", nargs="?", help="target name in the exporter's config")
    p.add_argument(
        "--until",
        choices=sorted(_WANTED),
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
    out = _Display(sys.stdout)
    try:
        _check_flags(args)
        if args.health_url:
            return _StandaloneWait(args, out).run()
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


def shown_url(url: str) -> str:
    """A URL as safe to print: user, password and query (it may carry a token) dropped."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


# --- formatting (shared with ``status``) ----------------------------------------------------


def eta_text(doc: TargetDoc) -> str:
    """``ETA 1m05s · usually ready in 10m40s`` from a target's status document."""
    parts = []
    if doc["eta_seconds"] is not None:
        parts.append(f"ETA {format_duration(doc['eta_seconds'])}")
    typical = doc["typical_cold_start_seconds"]
    previous = doc["previous_cold_start"]
    if typical is not None:
        parts.append(f"usually ready in {format_duration(typical)}")
    elif previous is not None and previous["outcome"] == "ready":
        parts.append(f"last start took {format_duration(previous['duration_seconds'])}")
    return " · ".join(parts)


def progress_bar(ratio: float | None, width: int, *, unicode: bool = True) -> str:
    """A fixed-width text bar; an unknown ratio draws an empty bar."""
    full, empty = ("█", "░") if unicode else ("#", "-")
    filled = round(max(0.0, min(1.0, ratio or 0.0)) * width)
    return full * filled + empty * (width - filled)


def gpu_text(doc: TargetDoc) -> str:
    """``GPU 2x 31.2 GiB``: the GPUs holding this target's memory, and the mean per GPU."""
    used = [g["used_bytes"] for g in doc["gpu_memory"] if g["used_bytes"]]
    if not used:
        return ""
    return f"GPU {len(used)}x {format_bytes(sum(used) / len(used))}"


def phase_label(doc: TargetDoc) -> str:
    """The phase, with ``(stalled)`` when the stall flag is up."""
    return doc["phase"] + (" (stalled)" if doc["stalled"] else "")


def notable_lines(doc: TargetDoc, limit: int = NOTABLE_SHOWN) -> list[str]:
    """The last notable log lines, benign noise dropped, as ``HH:MM:SS class text``."""
    lines = [e for e in doc["notable_lines"] if e["class"] != "benign"]
    return [
        f"  {time.strftime('%H:%M:%S', time.localtime(e['at']))}  {e['class']:<7} {e['text']}"
        for e in lines[-limit:]
    ]


# --- judging a status document --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a wait ended: the exit code and the one-line summary to print."""

    code: int
    summary: str


def judge(doc: TargetDoc, until: str) -> Verdict | None:
    """The verdict a target's status document gives, or None to keep waiting."""
    name, phase = doc["target"], doc["phase"]
    took = format_duration(doc["elapsed_seconds"])
    if phase in _WANTED[until]:
        return Verdict(EXIT_REACHED, f"{name} is {phase} (cold start took {_start_took(doc)})")
    if phase == "failed":
        why, reason = doc["failure_reason"] or "failed", doc["reason"]
        text = reason if why in reason else f"{why}: {reason}"
        if doc["reason_detail"]:
            text += f" ({doc['reason_detail']})"
        return Verdict(EXIT_FAILED, f"{name} failed after {took}: {text}")
    if doc["stalled"]:
        return Verdict(
            EXIT_FAILED, f"{name} stalled in {phase} after {took}: {doc['stall_reason']}"
        )
    return None


def _start_took(doc: TargetDoc) -> str:
    timeline = doc["timeline"]
    if timeline:
        return format_duration(sum(row["seconds"] for row in timeline))
    return "unknown: already up when the exporter started"


def change_line(doc: TargetDoc) -> str:
    """The line printed when a target's phase changes: ``[   52s] demo ready: reason``."""
    since, started = doc["since"], doc["started_at"]
    at = max(0.0, since - started) if since is not None and started is not None else None
    line = f"[{format_duration(at):>6}] {doc['target']} {phase_label(doc)}: {doc['reason']}"
    if doc["stalled"] and doc["stall_reason"]:
        line += f" ({doc['stall_reason']})"
    return line


#: Sparkline levels, lowest first; the ASCII set for terminals that cannot show blocks.
SPARKS: Final = "▁▂▃▄▅▆▇█"
ASCII_SPARKS: Final = "_.-=+*#@"
#: Polls a sparkline shows (one character each).
SPARK_WIDTH: Final = 16


def sparkline(values: Sequence[float | None], *, unicode: bool = True) -> str:
    """One character per value, scaled to the largest; an unknown value is a blank."""
    levels = SPARKS if unicode else ASCII_SPARKS
    top = max((v for v in values if v is not None), default=0.0)
    if top <= 0:
        return ""
    step = len(levels) - 1
    return "".join(" " if v is None else levels[round(v / top * step)] for v in values)


@dataclass
class Recent:
    """The last ``SPARK_WIDTH`` polls' GPU memory and read rate, for the live sparklines."""

    gpu: deque[float | None] = field(default_factory=lambda: deque(maxlen=SPARK_WIDTH))
    read: deque[float | None] = field(default_factory=lambda: deque(maxlen=SPARK_WIDTH))

    def add(self, doc: TargetDoc, read_rate: float | None) -> None:
        """Note one poll."""
        used = [g["used_bytes"] for g in doc["gpu_memory"] if g["used_bytes"]]
        self.gpu.append(float(sum(used)) if used else None)
        self.read.append(read_rate)


def live_line(
    doc: TargetDoc,
    read_rate: float | None,
    *,
    unicode: bool = True,
    recent: Recent | None = None,
) -> str:
    """The terminal's live line: phase, bar, progress, elapsed, GPU memory, read rate, ETA.

    With ``recent``, GPU memory and the read rate each get a sparkline of the last polls.
    """
    ratio = doc["progress_ratio"]
    gpu_spark = sparkline(recent.gpu, unicode=unicode) if recent else ""
    read_spark = sparkline(recent.read, unicode=unicode) if recent else ""
    parts = [
        f"{doc['target']} {phase_label(doc)}",
        progress_bar(ratio, 20, unicode=unicode),
        f"{ratio:.0%}" if ratio is not None else "",
        format_duration(doc["elapsed_seconds"]),
        " ".join(p for p in (gpu_text(doc), gpu_spark) if p),
        f"read {format_bytes(read_rate)}/s {read_spark}".rstrip() if read_rate else "",
        eta_text(doc),
    ]
    text = "  ".join(p for p in parts if p)
    return text if unicode else text.replace("·", "-")


# --- output ---------------------------------------------------------------------------------


class _Display:
    """Permanent lines for changes; on a terminal also one live line redrawn in place."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.tty = out.isatty()
        self.unicode = _can_encode(out, "█░·")
        self._live = False

    def line(self, text: str) -> None:
        """Print a permanent line (above the live one on a terminal)."""
        self._clear()
        print(text, file=self._out, flush=True)

    def live(self, text: str) -> None:
        """Redraw the live line (terminal only), cut to the terminal's width."""
        if not self.tty:
            return
        width = shutil.get_terminal_size((100, 24)).columns - 1
        self._out.write("\r\x1b[K" + text[:width])
        self._out.flush()
        self._live = True

    def close(self) -> None:
        """Remove the live line, leaving the cursor at the start of an empty line."""
        self._clear()

    def _clear(self) -> None:
        if self._live:
            self._out.write("\r\x1b[K")
            self._out.flush()
            self._live = False


def _can_encode(out: TextIO, text: str) -> bool:
    try:
        text.encode(getattr(out, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _fail(out: _Display, verdict: Verdict, doc: TargetDoc | None = None) -> int:
    out.close()
    print(verdict.summary, file=sys.stderr)
    lines = notable_lines(doc) if doc is not None else []
    if lines:
        print("last notable log lines:", file=sys.stderr)
        print("\n".join(lines), file=sys.stderr)
    return verdict.code


# --- daemon mode ----------------------------------------------------------------------------


class StatusClient:
    """Reads the exporter's ``/status``; every failure becomes a WaitError a person can act on."""

    def __init__(self, url: str, *, ca_file: str | None = None, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        try:
            verify = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise WaitError(f"--ca-file {ca_file}: cannot load: {exc}") from None
        self._client = httpx.Client(
            timeout=timeout,
            verify=verify,
            trust_env=False,
            headers={"User-Agent": f"inference-lifecycle-exporter-wait/{__version__}"},
        )

    def fetch(self) -> StatusDoc:
        """The status document, its shape checked (it comes from the network).

        Raises:
            WaitError: the exporter is unreachable, refuses us, or is not an exporter.
        """
        where = shown_url(self.url) + "/status"
        try:
            reply = self._client.get(self.url + "/status")
        except httpx.HTTPError as exc:
            raise WaitError(_unreachable(where, exc)) from None
        if reply.status_code == 401:
            raise WaitError(f"{where} asks for credentials: pass --url https://USER:PASSWORD@HOST")
        try:
            doc: object = reply.json() if reply.status_code == 200 else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("targets"), list):
            raise WaitError(
                f"{where} answered HTTP {reply.status_code} without the exporter's status "
                "document: is --url the exporter's address?"
            )
        try:
            return parse_status_doc(doc)
        except MalformedStatus as exc:
            raise WaitError(f"{where} answered a malformed status document: {exc}") from None

    def probe(self, target: str) -> tuple[int, str]:
        """The exporter's ``/probe`` answer for ``target``: (HTTP status, its line).

        Raises:
            WaitError: the exporter is unreachable or refuses us.
        """
        where = shown_url(self.url) + "/probe"
        try:
            reply = self._client.get(self.url + "/probe", params={"target": target})
        except httpx.HTTPError as exc:
            raise WaitError(_unreachable(where, exc)) from None
        if reply.status_code == 401:
            raise WaitError(f"{where} asks for credentials: pass --url https://USER:PASSWORD@HOST")
        return reply.status_code, reply.text.strip()[:500]

    def fetch_trail(self) -> dict[str, list[tuple[float | None, float | None]]]:
        """Per target, the current start's recent (GPU bytes, read bytes/s) from ``/trail``.

        For sparklines only: an older exporter without ``/trail``, or any reply of another
        shape, gives none rather than an error.
        """
        try:
            reply = self._client.get(self.url + "/trail")
            doc = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return {}
        targets = doc.get("targets") if isinstance(doc, dict) else None
        recent: dict[str, list[tuple[float | None, float | None]]] = {}
        for entry in targets if isinstance(targets, list) else []:
            current = entry.get("current") if isinstance(entry, dict) else None
            points = current.get("points") if isinstance(current, dict) else None
            if isinstance(points, list) and isinstance(entry.get("target"), str):
                recent[entry["target"]] = [_spark_values(p) for p in points[-SPARK_WIDTH:]]
        return recent

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()


def _spark_values(point: object) -> tuple[float | None, float | None]:
    """(GPU bytes summed, read bytes/s) of one ``/trail`` point; None where unknown."""
    if not isinstance(point, list) or len(point) < 5:
        return None, None
    gpus = [v for v in point[5:] if isinstance(v, int | float)]
    read = point[1] if isinstance(point[1], int | float) else None
    return (float(sum(gpus)) if gpus else None), read


def _unreachable(where: str, exc: httpx.HTTPError) -> str:
    # httpx's messages are the OS's ("[Errno -2] Name or service not known"); never the URL.
    cause = str(exc) or type(exc).__name__
    if "refused" in cause.lower():
        cause = "connection refused"
    elif isinstance(exc, httpx.TimeoutException):
        cause = "no answer in time"
    return (
        f"cannot reach the exporter at {where} ({cause}).\n"
        "  Is it running?         systemctl status inference-lifecycle-exporter\n"
        "  Listening elsewhere?   pass --url http://HOST:PORT (its --web.listen-address)\n"
        "  No exporter here?      probe the server itself: wait --health-url URL"
    )


def find_target(doc: StatusDoc, name: str) -> TargetDoc | None:
    """The named target's document.

    Raises:
        WaitError: the exporter has sampled and has no such target (lists the known ones).
    """
    for t in doc["targets"]:
        if t["target"] == name:
            return t
    if not doc["ready"]:
        return None  # no tick yet: targets appear after the first sample
    known = ", ".join(sorted(t["target"] for t in doc["targets"])) or "none configured"
    raise WaitError(f"no target named {name!r} at the exporter; known targets: {known}")


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
    def __init__(self, args: argparse.Namespace, out: _Display) -> None:
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
            return _fail(self._out, verdict, doc)
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
        return _fail(self._out, Verdict(EXIT_TIMEOUT, summary), doc)


# --- standalone mode ------------------------------------------------------------------------


def standalone_targets(args: argparse.Namespace) -> tuple[Target, Target | None]:
    """Targets for the prober: one for the health URL, one for the completion URL.

    Raises:
        WaitError: the completion URL does not end in ``/v1/completions``.
    """
    keys = {"api_key_file": args.api_key_file, "api_key_env": args.api_key_env}
    health = urlsplit(args.health_url)
    path = urlunsplit(("", "", health.path or "/", health.query, ""))
    base = urlunsplit((health.scheme, health.netloc, "", "", ""))
    timeout = args.probe_timeout
    target = Target("wait", "openai", base, path, timeout, **keys)
    if not args.completion_url:
        return target, None
    comp = urlsplit(args.completion_url)
    if not comp.path.rstrip("/").endswith(COMPLETION_SUFFIX) or comp.query:
        raise WaitError(f"--completion-url must end in {COMPLETION_SUFFIX} (OpenAI completions)")
    prefix = comp.path.rstrip("/").removesuffix(COMPLETION_SUFFIX)
    comp_base = urlunsplit((comp.scheme, comp.netloc, prefix, "", ""))
    completion = CompletionProbe(model=args.model, prompt=args.prompt)
    return target, Target("wait", "openai", comp_base, "/", timeout, completion, **keys)


def describe_probe(r: ProbeResult) -> str:
    """A probe result the way an operator reads it: ``503 loading``, ``refused``, ``200``."""
    if r.status_code is None:
        return r.outcome.value
    text = str(r.status_code)
    if r.loading:
        text += " loading"
    elif r.has_choices:
        text += " with choices"
    elif r.outcome is ProbeOutcome.BAD_BODY:
        text += " without choices"
    return text


def process_gone(pid: int) -> bool:
    """True when the process has exited (a zombie counts: it will never become ready)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (not Linux) or hidepid: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    # The state follows the last ')' (the command name may itself hold parentheses).
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


class _StandaloneWait:
    def __init__(self, args: argparse.Namespace, out: _Display) -> None:
        self._args, self._out = args, out
        self._started = time.monotonic()
        self._deadline = self._started + args.timeout
        self._shown: dict[str, str] = {}
        self._answered = False
        self._refused = 0

    def run(self) -> int:
        health_target, comp_target = standalone_targets(self._args)
        probers: list[Prober] = []
        try:
            for target in (health_target, comp_target):
                if target is not None:
                    probers.append(Prober(target, ca_file=self._args.ca_file))
            return self._loop(probers[0], probers[1] if comp_target else None)
        except ConfigError as exc:  # an unusable API key or CA file
            raise WaitError(str(exc)) from None
        finally:
            for prober in probers:
                prober.close()

    def _loop(self, health: Prober, comp: Prober | None) -> int:
        what = f"{shown_url(self._args.health_url)} to be {self._args.until}"
        self._out.line(f"waiting up to {format_duration(self._args.timeout)} for {what}")
        while True:
            verdict = self._round(health, comp)
            if verdict is not None:
                return self._finish(verdict)
            if time.monotonic() >= self._deadline:
                waited = format_duration(self._args.timeout)
                last = ", ".join(f"{k}: {v}" for k, v in self._shown.items()) or "no answer"
                summary = f"timed out after {waited} waiting for {self._args.until}; last {last}"
                return self._finish(Verdict(EXIT_TIMEOUT, summary))
            time.sleep(max(0.0, min(self._args.interval, self._deadline - time.monotonic())))

    def _round(self, health: Prober, comp: Prober | None) -> Verdict | None:
        if self._args.pid is not None and process_gone(self._args.pid):
            return Verdict(
                EXIT_FAILED, f"process {self._args.pid} exited before {self._args.until}"
            )
        h = self._probe("health", health.probe_health)
        if h.outcome in _FATAL_PROBE:
            raise WaitError(f"{shown_url(self._args.health_url)} {_FATAL_PROBE[h.outcome]}")
        if h.outcome is ProbeOutcome.REFUSED and self._answered:
            self._refused += 1
            if self._refused >= REFUSED_AFTER_ANSWER:
                why = "the server stopped listening after it had answered (exited or restarted)"
                return Verdict(EXIT_FAILED, why)
        elif h.outcome is not ProbeOutcome.REFUSED:
            self._answered, self._refused = True, 0
        if not h.ok:
            return None
        if comp is None:
            return Verdict(
                EXIT_REACHED, f"ready after {self._elapsed()}: health answers {h.status_code}"
            )
        c = self._probe("completion", comp.probe_completion)
        if c.outcome in _FATAL_PROBE:
            raise WaitError(f"{shown_url(self._args.completion_url)} {_FATAL_PROBE[c.outcome]}")
        if c.ok:
            return Verdict(
                EXIT_REACHED, f"serving after {self._elapsed()}: a completion returned choices"
            )
        return None

    def _probe(self, kind: str, call: Callable[[], ProbeResult]) -> ProbeResult:
        result = call()
        text = describe_probe(result)
        if self._shown.get(kind) != text:
            self._shown[kind] = text
            self._out.line(f"[{self._elapsed():>6}] {kind}: {text}")
        where = shown_url(self._args.health_url)
        self._out.live(f"waiting for {where}  {self._elapsed()}  {kind}: {text}")
        return result

    def _elapsed(self) -> str:
        return format_duration(time.monotonic() - self._started)

    def _finish(self, verdict: Verdict) -> int:
        if verdict.code != EXIT_REACHED:
            return _fail(self._out, verdict)
        self._out.line(verdict.summary)
        return verdict.code
