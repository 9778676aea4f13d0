"""TLS: the ``ssl`` context of a web config, rebuilt per connection on change, and SAN checks."""

from __future__ import annotations

import ipaddress
import logging
import ssl
import threading
from collections.abc import Mapping
from typing import Any, Final, Self

from exporter.base.errors import ConfigError
from exporter.web.config.reader import load_web_config, one_line
from exporter.web.config.schema import ClientAuthType, TlsSettings, WebConfig
from exporter.web.config.watch import WebConfigWatch

#: The package's logger, not the module's: log lines keep ``logger=exporter.web.config``.
log = logging.getLogger(__package__)


_VERIFY_MODES: Final = {
    ClientAuthType.NO_CLIENT_CERT: ssl.CERT_NONE,
    ClientAuthType.VERIFY_CLIENT_CERT_IF_GIVEN: ssl.CERT_OPTIONAL,
    ClientAuthType.REQUIRE_AND_VERIFY_CLIENT_CERT: ssl.CERT_REQUIRED,
}


def validate_web_config(path: str) -> WebConfig:
    """Load a web config file and build its TLS context, as the server would at startup.

    Raises:
        ConfigError: the first problem, naming the file and key.
    """
    config = load_web_config(path)
    if config.tls is not None:
        build_ssl_context(config.tls, path)
    return config


def build_ssl_context(tls: TlsSettings, path: str) -> ssl.SSLContext:
    """A server-side SSLContext for these settings, with the certificate files loaded.

    Raises:
        ConfigError: a file cannot be loaded or OpenSSL refuses a setting.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = tls.min_version
    ctx.maximum_version = tls.max_version
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        if tls.ciphers:
            ctx.set_ciphers(":".join(tls.ciphers))
        if tls.curve:
            ctx.set_ecdh_curve(tls.curve)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(path, "tls_server_config", f"rejected by OpenSSL: {exc}") from exc
    _load_files(ctx, tls, path)
    ctx.verify_mode = _VERIFY_MODES[tls.client_auth_type]
    return ctx


def _load_files(ctx: ssl.SSLContext, tls: TlsSettings, path: str) -> None:
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        reason = f"cannot load {tls.cert_file} with {tls.key_file}: {one_line(exc)}"
        raise ConfigError(path, "tls_server_config.cert_file", reason) from exc
    if tls.client_ca_file or tls.client_ca_pem:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file, cadata=tls.client_ca_pem)
        except (OSError, ssl.SSLError) as exc:
            reason = f"cannot load client CA: {one_line(exc)}"
            raise ConfigError(path, "tls_server_config.client_ca_file", reason) from exc


class ReloadingSSLContext(ssl.SSLContext):
    """A server SSLContext that hands every new connection the latest TLS settings.

    asyncio wraps each accepted socket with ``wrap_bio``; this delegates to a context rebuilt
    whenever the web config or its certificate, key or CA files change (as the watch's last
    refresh saw them, a second at most), so a rotated certificate is presented on the next
    connection after that. Unlike an ``sni_callback`` swap this
    also applies new versions, ciphers and client CAs. A failed rebuild (say, a certificate
    written before its key) keeps the previous context and is logged once.
    """

    def __new__(cls, watch: WebConfigWatch) -> Self:  # noqa: D102
        return super().__new__(cls, ssl.PROTOCOL_TLS_SERVER)

    def __init__(self, watch: WebConfigWatch) -> None:
        tls = watch.last_good.tls
        if tls is None:
            raise ValueError("ReloadingSSLContext needs a web config with tls_server_config")
        self._watch = watch
        self._lock = threading.Lock()
        self._key: tuple[object, ...] = (tls, watch.tls_files)
        self._current = build_ssl_context(tls, watch.last_good.path)

    def latest(self) -> ssl.SSLContext:
        """The context for the next connection, rebuilt first if anything changed."""
        try:
            config = self._watch.current()
        except ConfigError:
            config = self._watch.last_good
        if config.tls is None:
            return self._current
        key = (config.tls, self._watch.tls_files)
        if key != self._key:
            with self._lock:
                self._rebuild(key, config.tls, config.path)
        return self._current

    def _rebuild(self, key: tuple[object, ...], tls: TlsSettings, path: str) -> None:
        if key == self._key:
            return
        self._key = key
        try:
            self._current = build_ssl_context(tls, path)
        except ConfigError as exc:
            log.error("tls reload failed, keeping the previous certificate error=%r", str(exc))
            return
        log.info("tls context reloaded cert_file=%s", tls.cert_file)

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        """Wrap a connection's BIOs with the latest context (asyncio calls this per accept)."""
        return self.latest().wrap_bio(
            incoming,
            outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
            session=session,
        )


def peer_allowed(peercert: Mapping[str, Any] | None, allowed_sans: tuple[str, ...]) -> bool:
    """Whether a verified client certificate carries one of ``client_allowed_sans``.

    Matches DNS names, e-mail addresses, URIs and IP addresses exactly, as exporter-toolkit
    does; IP addresses are compared in canonical form.
    """
    if not allowed_sans:
        return True
    if not peercert:
        return False
    wanted = {_canonical_san(v) for v in allowed_sans}
    for _kind, value in peercert.get("subjectAltName", ()):
        if _canonical_san(str(value)) in wanted:
            return True
    return False


def _canonical_san(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return value
