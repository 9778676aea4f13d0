"""A list+watch client of the node's pods on the Kubernetes API server, in its own thread.

Built on httpx rather than the official ``kubernetes`` package: that package pulls in about
40 MB of generated models and takes over a second to import (issue 18 counts both against the
exporter's footprint on every GPU node), and discovery needs one request shape only, list and
watch of pods with a field selector. Never logs a token, a pod IP or a response body.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import yaml

from exporter.base.errors import ConfigError
from exporter.config import KubernetesDiscovery
from exporter.discovery.pods import field_obj, field_str, targets_from_pod
from exporter.discovery.watch import (
    ApiError,
    ListWatcher,
    StatusError,
    json_lines,
    json_object,
)

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Seconds the API server keeps one watch open before ending it (then it is resumed).
DEFAULT_WATCH_SECONDS: Final = 300
#: Seconds of silence after which a connection counts as stuck; bookmarks come every minute.
DEFAULT_READ_SECONDS: Final = 90.0
_GONE: Final = 410
_EARLY_END_SECONDS: Final = 1.0


class _Gone(Exception):
    """The resourceVersion is too old: list again (no backoff, this is routine)."""


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


class PodWatcher(ListWatcher[str]):
    """Lists, then watches, the pods of one node; keeps the current ones for ``snapshot()``.

    Runs in its own daemon thread (``start``), so a slow or hanging API server never delays
    the loop. A watch resumes from the last resourceVersion (bookmarks keep it fresh); a 410
    Gone lists again at once; any other failure waits ``backoff`` seconds, doubled each time
    up to ``backoff_cap``, then lists again. Every read is bounded by ``read_seconds`` of
    silence and every request by its deadline (the watch's ``timeoutSeconds`` plus a read).
    """

    kind = "kubernetes"

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
        client = httpx.Client(
            base_url=credentials.server,
            verify=credentials.ssl_context or True,
            trust_env=False,
            timeout=httpx.Timeout(read_seconds, connect=min(10.0, read_seconds)),
            limits=httpx.Limits(max_keepalive_connections=1),
        )
        super().__init__(
            client,
            _STATUS_REASONS,
            f"node={settings.node_name}",
            read_seconds=read_seconds,
            backoff=backoff,
            backoff_cap=backoff_cap,
            max_targets=settings.max_targets,
        )
        self._settings, self._credentials = settings, credentials
        self._watch_seconds = watch_seconds
        self._lock = threading.Lock()
        self._pods: dict[str, Mapping[str, object]] = {}

    def _routine(self, exc: Exception) -> bool:
        if isinstance(exc, _Gone):
            log.info("kubernetes watch expired, listing again")
        return isinstance(exc, _Gone)

    def _list(self) -> str:
        """Replace the pods with a fresh list; returns the list's resourceVersion."""
        with contextlib.closing(self._request({}, time.monotonic() + self._read_seconds)) as body:
            doc = json_object(b"".join(body))
        items = doc.get("items")
        pods = [p for p in items if isinstance(p, dict)] if isinstance(items, list) else []
        with self._lock:
            self._pods = {_uid(p): p for p in pods}
            self._publish()
        self._tracker.succeeded()
        return field_str(field_obj(doc, "metadata"), "resourceVersion")

    def _follow(self, version: str) -> str:
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
            for line in json_lines(chunks):
                version = self._apply(json_object(line)) or version
                events += 1
                self._tracker.succeeded()
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
        self._targets = self._bounded(found)

    def _request(self, params: Mapping[str, str], deadline: float) -> Generator[bytes, None, None]:
        """The body of ``GET /api/v1/pods`` on our node, in chunks, within ``deadline``."""
        query = {"fieldSelector": f"spec.nodeName={self._settings.node_name}", **params}
        headers = {"Accept": "application/json", **self._credentials.headers()}
        try:
            yield from self._streams.get("/api/v1/pods", query, headers, deadline)
        except StatusError as exc:
            if exc.status == _GONE:
                raise _Gone from None
            raise


_STATUS_REASONS: Final[Mapping[int, str]] = {
    401: "unauthorized",
    403: "forbidden",  # RBAC: the service account needs get, list and watch on pods
}


def _uid(pod: Mapping[str, object]) -> str:
    meta = field_obj(pod, "metadata")
    return field_str(meta, "uid") or f"{field_str(meta, 'namespace')}/{field_str(meta, 'name')}"
