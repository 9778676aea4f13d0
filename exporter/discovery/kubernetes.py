"""A list+watch client of the node's pods on the Kubernetes API server, in its own thread.

Built on httpx rather than the official ``kubernetes`` package: that package pulls in about
40 MB of generated models and takes over a second to import (issue 18 counts both against the
exporter's footprint on every GPU node), and discovery needs one request shape only, list and
watch of pods with a field selector. Never logs a token, a pod IP or a response body.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import yaml

from exporter.config import KubernetesDiscovery
from exporter.discovery.pods import DiscoveredTarget, field_obj, field_str, targets_from_pod
from exporter.errors import ConfigError
from exporter.sources.probe import Watchdog

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Seconds the API server keeps one watch open before ending it (then it is resumed).
DEFAULT_WATCH_SECONDS: Final = 300
#: Seconds of silence after which a connection counts as stuck; bookmarks come every minute.
DEFAULT_READ_SECONDS: Final = 90.0
#: A node runs at most a few hundred pods of some kB each; a bigger reply is not a pod list.
MAX_BODY_BYTES: Final = 64 << 20
MAX_REASON_CHARS: Final = 64
_GONE: Final = 410
_EARLY_END_SECONDS: Final = 1.0


class _Gone(Exception):
    """The resourceVersion is too old: list again (no backoff, this is routine)."""


class ApiError(Exception):
    """The API server's reply could not be used; ``reason`` is a short, bounded word."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason[:MAX_REASON_CHARS]


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API server is and how to prove who we are.

    A token file is read again for every request: projected service-account tokens rotate.
    """

    server: str
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None

    def headers(self) -> dict[str, str]:
        """The Authorization header, when we have a token."""
        token = self.token
        if self.token_file is not None:
            token = Path(self.token_file).read_text(encoding="utf-8").strip()
        return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True, slots=True)
class DiscoveryHealth:
    """How the watch goes: ``up`` after a list or watch succeeded, until one fails."""

    up: bool
    error: str | None
    synced: bool


def load_credentials(
    settings: KubernetesDiscovery,
    path: str,
    *,
    environ: Mapping[str, str] | None = None,
    service_account_dir: str = SERVICE_ACCOUNT_DIR,
) -> Credentials:
    """The kubeconfig's current context, else the pod's service account.

    ``path`` names the config file in errors, as the config reader does.

    Raises:
        ConfigError: one line naming the key and what is wrong (never a secret).
    """
    if settings.kubeconfig is not None:
        return _from_kubeconfig(settings.kubeconfig, path)
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    where = "discovery.kubernetes.kubeconfig"
    if not host:
        raise ConfigError(
            path, where, "is required outside a cluster (KUBERNETES_SERVICE_HOST unset)"
        )
    account = Path(service_account_dir)
    token_file, ca_file = account / "token", account / "ca.crt"
    if not token_file.is_file() or not ca_file.is_file():
        raise ConfigError(path, where, f"is required: no service account token in {account}")
    shown = f"[{host}]" if ":" in host else host
    return Credentials(
        server=f"https://{shown}:{port}",
        ssl_context=_tls_context(path, where, ca=ca_file.read_bytes()),
        token_file=str(token_file),
    )


def _from_kubeconfig(kubeconfig: str, path: str) -> Credentials:
    where = "discovery.kubernetes.kubeconfig"
    try:
        doc = yaml.safe_load(Path(kubeconfig).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(path, where, f"cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(path, where, "is not YAML") from exc
    if not isinstance(doc, dict):
        raise ConfigError(path, where, "is not a kubeconfig")
    context = _named(doc, "contexts", doc.get("current-context"), "context")
    cluster = _named(doc, "clusters", context.get("cluster") if context else None, "cluster")
    if context is None or cluster is None:
        raise ConfigError(path, where, "has no current-context with a cluster")
    user = _named(doc, "users", context.get("user"), "user") or {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise ConfigError(path, where, "current context's cluster has no http(s) server")
    base = Path(kubeconfig).parent
    tls = None
    if server.startswith("https://"):
        try:
            ca, cert, key = (
                _pem(base, entry, name)
                for entry, name in (
                    (cluster, "certificate-authority"),
                    (user, "client-certificate"),
                    (user, "client-key"),
                )
            )
        except (OSError, ValueError) as exc:  # binascii.Error is a ValueError
            raise ConfigError(path, where, f"certificate unreadable: {type(exc).__name__}") from exc
        tls = _tls_context(path, where, ca=ca, cert=cert, key=key)
    token = user.get("token")
    return Credentials(
        server=server.rstrip("/"),
        ssl_context=tls,
        token=token if isinstance(token, str) else None,
        token_file=_relative(base, user.get("tokenFile")),
    )


def _named(
    doc: Mapping[str, object], section: str, name: object, key: str
) -> Mapping[str, object] | None:
    """The entry called ``name`` of a kubeconfig list (``contexts``, ``clusters``, ``users``)."""
    entries = doc.get(section)
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key)
            return value if isinstance(value, dict) else None
    return None


def _relative(base: Path, value: object) -> str | None:
    """A kubeconfig path: relative ones count from the kubeconfig's own directory."""
    return str(base / value) if isinstance(value, str) and value else None


def _pem(base: Path, entry: Mapping[str, object], key: str) -> bytes | None:
    """PEM bytes of ``key`` (a path) or ``key-data`` (base64), as kubeconfig allows either."""
    data = entry.get(f"{key}-data")
    if isinstance(data, str) and data:
        return base64.b64decode(data, validate=False)
    file = _relative(base, entry.get(key))
    return Path(file).read_bytes() if file else None


def _tls_context(
    path: str,
    where: str,
    *,
    ca: bytes | None = None,
    cert: bytes | None = None,
    key: bytes | None = None,
) -> ssl.SSLContext:
    """A verifying TLS context: the cluster's CA (else the system's) and our client certificate.

    ``ssl`` loads a client key from files only: it goes through a private temporary directory,
    removed before this returns.
    """
    try:
        ctx = ssl.create_default_context(cadata=ca.decode("ascii") if ca else None)
        if cert and key:
            with tempfile.TemporaryDirectory() as private:  # mode 0700
                cert_file, key_file = Path(private, "cert.pem"), Path(private, "key.pem")
                cert_file.write_bytes(cert)
                key_file.write_bytes(key)
                ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(path, where, f"TLS files unusable: {type(exc).__name__}") from exc
    return ctx


class PodWatcher:
    """Lists, then watches, the pods of one node; keeps the current ones for ``snapshot()``.

    Runs in its own daemon thread (``start``), so a slow or hanging API server never delays
    the loop. A watch resumes from the last resourceVersion (bookmarks keep it fresh); a 410
    Gone lists again at once; any other failure waits ``backoff`` seconds, doubled each time
    up to ``backoff_cap``, then lists again. Every read is bounded by ``read_seconds`` of
    silence and every request by its deadline (the watch's ``timeoutSeconds`` plus a read).
    """

    def __init__(
        self,
        settings: KubernetesDiscovery,
        credentials: Credentials,
        *,
        watch_seconds: int = DEFAULT_WATCH_SECONDS,
        read_seconds: float = DEFAULT_READ_SECONDS,
        backoff: float = 1.0,
        backoff_cap: float = 60.0,
    ) -> None:
        self._settings, self._credentials = settings, credentials
        self._watch_seconds, self._read_seconds = watch_seconds, read_seconds
        self._backoff, self._backoff_cap = backoff, backoff_cap
        self._lock = threading.Lock()
        self._pods: dict[str, Mapping[str, object]] = {}
        self._targets: tuple[DiscoveredTarget, ...] = ()
        self._health = DiscoveryHealth(up=False, error="not_synced", synced=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dog: Watchdog | None = None  # the running request's
        self._client = httpx.Client(
            base_url=credentials.server,
            verify=credentials.ssl_context or True,
            trust_env=False,
            timeout=httpx.Timeout(read_seconds, connect=min(10.0, read_seconds)),
            limits=httpx.Limits(max_keepalive_connections=1),
        )
        #: Lists done (the first, then one after each 410 or failure): tests and logs use it.
        self.lists = 0

    def start(self) -> None:
        """Start the watching thread."""
        self._thread = threading.Thread(target=self._run, name="kubernetes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching: the running request's socket is shut down, the thread joined."""
        self._stop.set()
        if (dog := self._dog) is not None:
            dog.fire()
        if self._thread is not None:
            self._thread.join(timeout=self._read_seconds + 1)
        self._client.close()

    def snapshot(self) -> tuple[DiscoveredTarget, ...]:
        """The targets of the pods on the node now (empty until the first list)."""
        return self._targets  # one reference read: replaced whole, never changed in place

    def health(self) -> DiscoveryHealth:
        """Whether the last request succeeded, and why not."""
        return self._health

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        delay = self._backoff
        while not self._stop.is_set():
            try:
                version = self._list()
                delay = self._backoff
                while not self._stop.is_set():
                    version = self._watch(version)
            except _Gone:
                log.info("kubernetes watch expired, listing again")
            except Exception as exc:  # the thread must outlive any reply; a bug is logged
                if self._stop.is_set():
                    return
                if not isinstance(exc, httpx.HTTPError | ApiError | OSError | ValueError):
                    log.exception("kubernetes discovery failed unexpectedly")
                self._failed(_reason(exc))
                self._stop.wait(delay)
                delay = min(self._backoff_cap, delay * 2)

    def _list(self) -> str:
        """Replace the pods with a fresh list; returns the list's resourceVersion."""
        self.lists += 1
        with contextlib.closing(self._request({}, time.monotonic() + self._read_seconds)) as body:
            doc = _json_object(b"".join(body))
        items = doc.get("items")
        pods = [p for p in items if isinstance(p, dict)] if isinstance(items, list) else []
        with self._lock:
            self._pods = {_uid(p): p for p in pods}
            self._publish()
        self._succeeded()
        return field_str(field_obj(doc, "metadata"), "resourceVersion")

    def _watch(self, version: str) -> str:
        """Apply watch events until the server ends the watch; returns where to resume."""
        params = {
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_seconds),
        }
        started = time.monotonic()
        deadline = started + self._watch_seconds + self._read_seconds
        events = 0
        # Closed at once when an event raises: an abandoned stream would hold its socket
        # until the garbage collector found it.
        with contextlib.closing(self._request(params, deadline)) as chunks:
            for line in _lines(chunks):
                version = self._apply(_json_object(line)) or version
                events += 1
                self._succeeded()
        if not events and time.monotonic() - started < _EARLY_END_SECONDS:
            # A watch the server ends at once, again and again, would spin: back off.
            raise ApiError("watch_ended_early")
        return version

    def _apply(self, event: Mapping[str, object]) -> str:
        """One watch event on the pods; returns its resourceVersion ("" for none)."""
        kind, obj = event.get("type"), field_obj(event, "object")
        if kind == "ERROR":
            code = obj.get("code")
            if code == _GONE:
                raise _Gone
            raise ApiError(f"watch_error_{code}" if isinstance(code, int) else "watch_error")
        version = field_str(field_obj(obj, "metadata"), "resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(_uid(obj), None)
                else:
                    self._pods[_uid(obj)] = obj
                self._publish()
        elif kind != "BOOKMARK":
            raise ApiError("unknown_event")
        return version

    def _publish(self) -> None:
        """Recompute the targets (under the lock, after each change)."""
        found = [t for pod in self._pods.values() for t in targets_from_pod(pod, self._settings)]
        self._targets = tuple(sorted(found, key=lambda t: t.target.name))

    def _request(self, params: Mapping[str, str], deadline: float) -> Generator[bytes, None, None]:
        """The body of ``GET /api/v1/pods`` on our node, in chunks, within ``deadline``."""
        query = {"fieldSelector": f"spec.nodeName={self._settings.node_name}", **params}
        headers = {"Accept": "application/json", **self._credentials.headers()}
        self._dog = dog = Watchdog(max(0.0, deadline - time.monotonic()))
        if self._stop.is_set():
            dog.fire()  # close() ran before this request's watchdog existed
        try:
            yield from self._stream(query, headers, dog)
        except httpx.HTTPError:
            if dog.fired:  # the read the watchdog cut short
                raise ApiError("deadline_exceeded") from None
            raise
        finally:
            dog.disarm()  # no-op when _stream did it
        if dog.fired:  # the stream ended early because the watchdog cut it
            raise ApiError("deadline_exceeded")

    def _stream(
        self, query: Mapping[str, str], headers: Mapping[str, str], dog: Watchdog
    ) -> Generator[bytes, None, None]:
        extensions = {"trace": dog.trace}
        with self._client.stream(
            "GET", "/api/v1/pods", params=query, headers=headers, extensions=extensions
        ) as reply:
            if reply.status_code == _GONE:
                raise _Gone
            if reply.status_code != 200:
                raise ApiError(_STATUS_REASONS.get(reply.status_code, f"http_{reply.status_code}"))
            total = 0
            try:
                for chunk in reply.iter_raw():
                    total += len(chunk)
                    if total > MAX_BODY_BYTES:
                        raise ApiError("body_too_large")
                    yield chunk
            finally:
                dog.disarm()  # before the connection goes back to the pool

    def _succeeded(self) -> None:
        if not self._health.up:
            log.info("kubernetes discovery up node=%s", self._settings.node_name)
        self._health = DiscoveryHealth(up=True, error=None, synced=True)

    def _failed(self, reason: str) -> None:
        if self._health.up or self._health.error != reason:
            log.warning("kubernetes discovery down reason=%s", reason)
        self._health = DiscoveryHealth(up=False, error=reason, synced=self._health.synced)


_STATUS_REASONS: Final[Mapping[int, str]] = {
    401: "unauthorized",
    403: "forbidden",  # RBAC: the service account needs get, list and watch on pods
}


def _reason(exc: Exception) -> str:
    """A short word for a failure: never the exception's text, which may carry a URL."""
    if isinstance(exc, ApiError):
        return exc.reason
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.HTTPError):
        return "http_error"
    if isinstance(exc, ValueError):
        return "bad_response"
    return "os_error" if isinstance(exc, OSError) else "internal_error"


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Newline-separated watch events; each is a whole JSON document."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


def _json_object(data: bytes) -> Mapping[str, object]:
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ApiError("bad_response")
    return doc


def _uid(pod: Mapping[str, object]) -> str:
    meta = field_obj(pod, "metadata")
    return field_str(meta, "uid") or f"{field_str(meta, 'namespace')}/{field_str(meta, 'name')}"
