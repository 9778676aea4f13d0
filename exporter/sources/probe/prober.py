"""The probe source: one target's health and completion probes, and what its answers mean.

Each probe is bounded by one total deadline and a body cap (after decompression); it never logs
bodies or the API key. ``X-Prometheus-Scrape-Timeout-Seconds`` does not apply: probes run on the
daemon's loop, not on demand for a scrape. The requests go through ``client`` (HTTP/1.1 over a
kept-alive connection per target); ``answers`` and ``reports`` say what the replies mean.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Final

from exporter import __version__
from exporter.base.model import EngineReport, ProbeKind, ProbeOutcome, ProbeResult
from exporter.config import Target
from exporter.config.keys import load_api_key
from exporter.engines import ReportKind
from exporter.sources import TargetSeen
from exporter.sources.probe.answers import judge, says_sleeping
from exporter.sources.probe.client import Failed, HttpClient, Reply
from exporter.sources.probe.reports import LIVE, REQUESTS, read_report

log = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES: Final = 65536
#: After a sleep-state endpoint answered 404 or 405, ask again only after this long.
SLEEP_RETRY_SECONDS: Final = 300.0
#: A ready server's live report is asked this often; one that gave none, after this long.
REPORT_EVERY_SECONDS: Final = 5.0
REPORT_RETRY_SECONDS: Final = 30.0
#: An engine's /metrics is larger than a health reply: its own, higher cap.
REPORT_MAX_BODY_BYTES: Final = 4 << 20


class Prober:
    """Health and completion probes of one target over HTTP/1.1.

    The health probe and what ``sample`` asks after it (sleep state, engine report) share one
    kept-alive connection, reused across ticks while every exchange on it ends cleanly and it
    stays quiet while idle; anything else closes it and the next request connects afresh. The
    completion probe runs in another thread: it opens a connection of its own per call and
    closes it after.

    Every call makes one request (no redirects, no proxy: nothing reads the environment),
    retried once in one case only: when a reused kept connection fails before any byte of
    the response arrived (the send breaks with EPIPE or ECONNRESET, or the first read meets
    an end of file or a reset: the server closed it as it was reused), the request is sent
    once more over a fresh connection, within the same total deadline. Never after a fresh
    connection failed, never once response bytes arrived, never for the completion probe.
    Each call returns within ``target.probe_timeout_seconds`` plus scheduling slack. As a
    ``Source`` (``sample``) it is the health probe; the completion probe can take seconds,
    so the daemon runs it beside the loop rather than in a tick.
    """

    name: Final = "probe"

    def __init__(
        self,
        target: Target,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        ca_file: str | None = None,
    ) -> None:
        """Prepare the probes' headers and TLS context; reads the API key once.

        Raises:
            ConfigError: the API key or CA file cannot be used (see ``load_api_key``).
        """
        self._target = target
        self._timeout = target.probe_timeout_seconds
        self._completion_path = target.profile.completion_path
        headers = [
            (b"User-Agent", f"inference-lifecycle-exporter/{__version__}".encode()),
            (b"Accept", b"application/json"),
            (b"Accept-Encoding", b"gzip, deflate"),
        ]
        key = load_api_key(target)
        if key is not None:
            headers.append((b"Authorization", f"Bearer {key}".encode("ascii")))
        self._http: Final = HttpClient(
            target.base_url,
            target.health_path,  # its route now, as check-config vouched for it
            tuple(headers),
            cap=max_body_bytes,
            ca_file=ca_file,
            name=target.name,
        )
        # every input of what ``sample`` asks and how: the API key is in the headers
        profile = target.profile
        self._key = (
            "probe",
            (target.base_url, target.health_path, self._timeout, tuple(headers)),
            (max_body_bytes, ca_file, profile.sleep_path, profile.report),
        )
        self._last: dict[ProbeKind, ProbeOutcome] = {}
        self._sleep_retry_at = 0.0
        self._report: EngineReport | None = None
        self._report_final = False
        self._report_due = 0.0

    @property
    def share_key(self) -> tuple[object, ...]:
        """Targets probed alike share one health probe a tick (``daemon.shared``)."""
        return self._key

    def probe_health(self) -> ProbeResult:
        """GET the engine's health path over the kept connection; OK on any 2xx. Never raises."""
        return self._probe(ProbeKind.HEALTH, "GET", self._target.health_path, None, self._timeout)

    def sample(self, deadline: float | None = None, seen: TargetSeen | None = None) -> ProbeResult:
        """The health probe as the loop's source; the probe timeout bounds it.

        After a good health probe of an engine with a sleep mode, the same budget also asks
        whether it sleeps (vLLM answers 200 to ``/health`` while asleep). Every request goes
        over the kept connection. Never called concurrently with itself (the runner starts no
        source whose last call still runs).
        """
        health = self.probe_health()
        if health.ok and self._target.profile.sleep_path is not None:
            budget = self._timeout - health.duration_seconds
            health = replace(health, sleeping=self._ask_sleeping(budget))
        report = self._engine_report(health)
        return health if report is None else replace(health, report=report)

    def _engine_report(self, health: ProbeResult) -> EngineReport | None:
        """What the engine reports on its own startup, asked when it can say something new.

        A live report (Triton's per-model states) is asked on every tick the server answers
        until it is ready, then every ``REPORT_EVERY_SECONDS``; a summary (TensorRT-LLM's and
        SGLang's startup seconds) once the server is ready, again after a restart. Between
        asks the last report stands; a server that stopped answering has none.
        """
        kind = self._target.profile.report
        if kind is None:
            return None
        if health.status_code is None:  # not listening: a new instance reports anew
            self._report, self._report_final = None, False
            return None
        now = time.monotonic()
        if kind in LIVE:
            due = not health.ok or now >= self._report_due
        else:
            due = health.ok and not self._report_final and now >= self._report_due
        if due:
            budget = self._timeout - health.duration_seconds - (time.monotonic() - now)
            fetched = self._fetch_report(kind, budget)
            self._report_due = now + (REPORT_EVERY_SECONDS if fetched else REPORT_RETRY_SECONDS)
            if fetched is not None:
                self._report, self._report_final = fetched, kind not in LIVE
        return self._report

    def _fetch_report(self, kind: ReportKind, budget: float) -> EngineReport | None:
        method, path, body = REQUESTS[kind]
        reply = Reply()
        try:
            self._http.request(
                method, path, body, reply, max(budget, 0.05), REPORT_MAX_BODY_BYTES, keep=True
            )
        except Failed:
            return None
        if reply.status is None or not 200 <= reply.status < 300:
            return None  # not offered by this version or these flags: normal, never an error
        return read_report(kind, reply.body)

    def probe_completion(self) -> ProbeResult:
        """POST a tiny greedy completion; OK only on 2xx JSON with ``choices``. Never raises.

        Over a fresh connection of its own, closed after: it runs beside the loop's requests.
        """
        probe = self._target.completion
        if probe is None:
            return ProbeResult(ProbeKind.COMPLETION, ProbeOutcome.ERROR, None, 0.0, time.time())
        payload = {
            "model": probe.model,
            "prompt": probe.prompt,
            "max_tokens": probe.max_tokens,
            "temperature": 0,
        }
        return self._probe(
            ProbeKind.COMPLETION,
            "POST",
            self._completion_path,
            json.dumps(payload).encode(),
            probe.timeout_seconds,
        )

    def close(self) -> None:
        """Close the kept connection; a request still running then keeps nothing after it."""
        self._http.close()

    def _probe(
        self, kind: ProbeKind, method: str, path: str, content: bytes | None, timeout: float
    ) -> ProbeResult:
        started = time.monotonic()
        reply = Reply()
        try:
            self._http.request(method, path, content, reply, timeout, keep=kind is ProbeKind.HEALTH)
            result = judge(kind, reply)
        except Failed as failed:  # the probe's contract: an outcome, never an exception
            result = ProbeResult(kind, failed.outcome, reply.status, 0.0, 0.0)
        result = replace(result, duration_seconds=time.monotonic() - started, at=time.time())
        self._log_edge(result)
        return result

    def _ask_sleeping(self, budget: float) -> bool | None:
        """Whether the engine says it sleeps; None when it does not say (never an error).

        vLLM offers ``/is_sleeping`` only with ``VLLM_SERVER_DEV_MODE=1``: a 404 or 405 means
        not offered, asked again after ``SLEEP_RETRY_SECONDS`` (a restart may turn it on).
        """
        path = self._target.profile.sleep_path
        if path is None or time.monotonic() < self._sleep_retry_at:
            return None
        reply = Reply()
        try:
            self._http.request("GET", path, None, reply, max(budget, 0.05), keep=True)
        except Failed:
            return None
        if reply.status in (404, 405):
            self._sleep_retry_at = time.monotonic() + SLEEP_RETRY_SECONDS
            log.info(
                "sleep state not offered target=%s path=%s status=%s "
                "(vLLM offers it with VLLM_SERVER_DEV_MODE=1); asking again in %gs",
                self._target.name,
                path,
                reply.status,
                SLEEP_RETRY_SECONDS,
            )
            return None
        return says_sleeping(reply.status or 0, reply.body)

    def _log_edge(self, result: ProbeResult) -> None:
        if self._last.get(result.kind) is result.outcome:
            return
        self._last[result.kind] = result.outcome
        log.debug(
            "probe outcome changed target=%s probe=%s outcome=%s status=%s loading=%s",
            self._target.name,
            result.kind,
            result.outcome,
            result.status_code,
            result.loading,
        )
