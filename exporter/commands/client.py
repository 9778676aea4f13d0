"""The commands' shared client of the exporter's HTTP API: ``/status``, ``/probe``, ``/trail``.

``wait``, ``status`` and ``probe`` read the daemon through it; every failure becomes a
:class:`WaitError` worded for the person at the terminal, and no URL credential is ever shown.
"""

from __future__ import annotations

import argparse
import ssl
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import httpx

from exporter import __version__
from exporter.commands.text import SPARK_WIDTH
from exporter.render.status_doc import MalformedStatus, StatusDoc, TargetDoc, parse_status_doc

EXIT_USAGE: Final = 2
DEFAULT_URL: Final = "http://127.0.0.1:10049"


class WaitError(Exception):
    """Waiting cannot even begin or continue: bad flags, unreachable exporter (exit 2)."""


def add_daemon_flags(p: argparse.ArgumentParser) -> None:
    """``--url`` and ``--ca-file``: where the exporter's ``/status`` is (shared with ``status``)."""
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the exporter's address (default {DEFAULT_URL}); basic auth as https://user:pw@host",
    )
    p.add_argument("--ca-file", default=None, help="CA bundle for an https exporter or server")


def shown_url(url: str) -> str:
    """A URL as safe to print: user, password and query (it may carry a token) dropped."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


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
