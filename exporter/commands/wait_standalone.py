"""``wait --health-url``: the wait without an exporter, probing the server itself.

For CI scripts and Kubernetes hooks: the project's prober asks the health URL (and, for
``--until serving``, a real completion) until it answers, the process exits, or time runs out.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from exporter.base.errors import ConfigError
from exporter.base.model import ProbeOutcome, ProbeResult
from exporter.base.units import format_duration
from exporter.commands.client import WaitError, shown_url
from exporter.commands.text import Display
from exporter.commands.verdict import EXIT_FAILED, EXIT_REACHED, EXIT_TIMEOUT, Verdict, fail
from exporter.config import CompletionProbe, Target
from exporter.sources.probe import Prober

#: Standard OpenAI-compatible completion path; the prober appends it to a base URL.
COMPLETION_SUFFIX: Final = "/v1/completions"
#: Refused connections in a row, after the server had answered, that mean it went away.
REFUSED_AFTER_ANSWER: Final = 2
#: Probe outcomes no amount of waiting fixes: the flags or the key are wrong.
_FATAL_PROBE: Final[Mapping[ProbeOutcome, str]] = {
    ProbeOutcome.UNAUTHORIZED: "answered 401/403: pass --api-key-file or --api-key-env",
    ProbeOutcome.REDIRECT: "answered a redirect: pass the final URL",
    ProbeOutcome.TLS: "TLS handshake failed: check the scheme, or pass --ca-file",
}


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


class StandaloneWait:
    """The standalone wait: probes ``--health-url`` (and ``--completion-url``) each interval."""

    def __init__(self, args: argparse.Namespace, out: Display) -> None:
        self._args, self._out = args, out
        self._started = time.monotonic()
        self._deadline = self._started + args.timeout
        self._shown: dict[str, str] = {}
        self._answered = False
        self._refused = 0

    def run(self) -> int:
        """Wait as the flags say; the exit code documented in ``wait --help``."""
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
            return fail(self._out, verdict)
        self._out.line(verdict.summary)
        return verdict.code
