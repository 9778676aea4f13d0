"""The exporter-toolkit ``web-config.yml`` format: parsing, TLS contexts and basic-auth checks.

Reads files and builds ``ssl`` contexts; serves nothing (``web`` does). What Python's ``ssl``
cannot enforce is rejected by name instead of being silently ignored.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Self

import bcrypt
import yaml

from exporter.base.errors import ConfigError
from exporter.base.files import FileIdentity, file_identity
from exporter.config import parse_duration

log = logging.getLogger(__name__)


class ClientAuthType(StrEnum):
    """The ``client_auth_type`` values that Python's ``ssl`` can enforce."""

    NO_CLIENT_CERT = "NoClientCert"
    VERIFY_CLIENT_CERT_IF_GIVEN = "VerifyClientCertIfGiven"
    REQUIRE_AND_VERIFY_CLIENT_CERT = "RequireAndVerifyClientCert"


_VERIFY_MODES: Final = {
    ClientAuthType.NO_CLIENT_CERT: ssl.CERT_NONE,
    ClientAuthType.VERIFY_CLIENT_CERT_IF_GIVEN: ssl.CERT_OPTIONAL,
    ClientAuthType.REQUIRE_AND_VERIFY_CLIENT_CERT: ssl.CERT_REQUIRED,
}
# Go asks for a certificate without verifying it; OpenSSL through Python cannot do that.
_UNENFORCEABLE_CLIENT_AUTH: Final = (
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",
)

_TLS_VERSIONS: Final = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go's tls.CipherSuites() names -> OpenSSL names (TLS 1.2 and below).
_CIPHERS: Final = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# Go accepts these names but, like OpenSSL's cipher list, never applies them: TLS 1.3 suites
# are not configurable there either.
_TLS13_CIPHERS: Final = frozenset(
    {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
)
_CURVES: Final = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}

# exporter-toolkit's extraHTTPHeaders: the only headers an operator may add, with the values
# allowed where the header is an enumeration.
_HEADERS: Final[dict[str, tuple[str, ...]]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_BCRYPT_HASH: Final = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
_BCRYPT_MAX_PASSWORD: Final = 72
_AUTH_CACHE_SIZE: Final = 100

_TOP_KEYS: Final = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS: Final = (
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_ca",
    "cert",
    "key",
    "client_auth_type",
    "cipher_suites",
    "curve_preferences",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
)
_HTTP_KEYS: Final = ("headers", "http2")
_RATE_KEYS: Final = ("interval", "burst")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """``tls_server_config`` with paths made absolute and names mapped to OpenSSL's."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_ca_pem: str | None = None
    client_auth_type: ClientAuthType = ClientAuthType.NO_CLIENT_CERT
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ciphers: tuple[str, ...] = ()
    curve: str | None = None
    prefer_server_cipher_suites: bool = True
    client_allowed_sans: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket shared by all clients: ``burst`` requests, one more per ``interval``."""

    interval_seconds: float
    burst: int


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A parsed web config file; the default (no file) serves plain HTTP with no auth."""

    path: str = ""
    tls: TlsSettings | None = None
    headers: tuple[tuple[str, str], ...] = ()
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)
    rate_limit: RateLimit | None = None
    http2: bool = True


def load_web_config(path: str) -> WebConfig:
    """Read and validate a web config file (certificate files are checked by ``build``).

    Raises:
        ConfigError: the file cannot be read or holds an invalid or unsupported setting.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(path, "", f"invalid YAML: {_one_line(exc)}") from exc
    return parse_web_config(data, path)


def parse_web_config(data: object, path: str) -> WebConfig:
    """Validate the YAML document of a web config file.

    Raises:
        ConfigError: naming the file, the key and the reason.
    """
    top = _mapping(data, path, "")
    _reject_unknown(top, _TOP_KEYS, path, "")
    base = os.path.dirname(os.path.abspath(path))
    http = _mapping(top.get("http_server_config"), path, "http_server_config")
    _reject_unknown(http, _HTTP_KEYS, path, "http_server_config")
    return WebConfig(
        path=path,
        tls=_parse_tls(
            _mapping(top.get("tls_server_config"), path, "tls_server_config"), path, base
        ),
        headers=_parse_headers(http.get("headers"), path),
        basic_auth_users=_parse_users(top.get("basic_auth_users"), path),
        rate_limit=_parse_rate_limit(_mapping(top.get("rate_limit"), path, "rate_limit"), path),
        http2=_bool(http, "http2", True, path, "http_server_config"),
    )


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
        reason = f"cannot load {tls.cert_file} with {tls.key_file}: {_one_line(exc)}"
        raise ConfigError(path, "tls_server_config.cert_file", reason) from exc
    if tls.client_ca_file or tls.client_ca_pem:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file, cadata=tls.client_ca_pem)
        except (OSError, ssl.SSLError) as exc:
            reason = f"cannot load client CA: {_one_line(exc)}"
            raise ConfigError(path, "tls_server_config.client_ca_file", reason) from exc


def _parse_tls(section: Mapping[str, Any], path: str, base: str) -> TlsSettings | None:
    if not section:
        return None
    _reject_unknown(section, _TLS_KEYS, path, "tls_server_config")
    cert, key = _cert_pair(section, path)
    ca_file = _string(section, "client_ca_file", path, "tls_server_config")
    ca_pem = _string(section, "client_ca", path, "tls_server_config")
    auth = _client_auth(section, path, ca_file or ca_pem)
    low, high = _versions(section, path)
    prefer = _bool(section, "prefer_server_cipher_suites", True, path, "tls_server_config")
    return TlsSettings(
        cert_file=_join(base, cert),
        key_file=_join(base, key),
        client_ca_file=_join(base, ca_file) if ca_file else None,
        client_ca_pem=ca_pem,
        client_auth_type=auth,
        min_version=low,
        max_version=high,
        ciphers=_ciphers(section, path),
        curve=_curve(section, path),
        prefer_server_cipher_suites=prefer,
        client_allowed_sans=_allowed_sans(section, path, auth),
    )


def _cert_pair(section: Mapping[str, Any], path: str) -> tuple[str, str]:
    for inline in ("cert", "key"):
        if section.get(inline) is not None:
            reason = f"inline certificates are not supported; use {inline}_file"
            raise ConfigError(path, f"tls_server_config.{inline}", reason)
    cert = _string(section, "cert_file", path, "tls_server_config")
    key = _string(section, "key_file", path, "tls_server_config")
    if not cert or not key:
        missing = "cert_file" if not cert else "key_file"
        raise ConfigError(path, f"tls_server_config.{missing}", "required when TLS is configured")
    return cert, key


def _allowed_sans(section: Mapping[str, Any], path: str, auth: ClientAuthType) -> tuple[str, ...]:
    sans = _string_list(section, "client_allowed_sans", path, "tls_server_config")
    # Only a required, verified certificate leaves something to match (exporter-toolkit too).
    if sans and auth is not ClientAuthType.REQUIRE_AND_VERIFY_CLIENT_CERT:
        reason = "requires client_auth_type: RequireAndVerifyClientCert"
        raise ConfigError(path, "tls_server_config.client_allowed_sans", reason)
    return tuple(sans)


def _client_auth(section: Mapping[str, Any], path: str, has_ca: str | None) -> ClientAuthType:
    field_name = "tls_server_config.client_auth_type"
    raw = _string(section, "client_auth_type", path, "tls_server_config") or "NoClientCert"
    if raw in _UNENFORCEABLE_CLIENT_AUTH:
        reason = (
            f"{raw} cannot be enforced by Python's ssl (it cannot request a certificate "
            "without verifying it); use RequireAndVerifyClientCert or VerifyClientCertIfGiven"
        )
        raise ConfigError(path, field_name, reason)
    try:
        auth = ClientAuthType(raw)
    except ValueError:
        raise ConfigError(path, field_name, f"unknown value {raw!r}") from None
    if has_ca and auth is ClientAuthType.NO_CLIENT_CERT:
        raise ConfigError(path, field_name, "client CA configured without a client auth type")
    if not has_ca and auth is not ClientAuthType.NO_CLIENT_CERT:
        raise ConfigError(path, "tls_server_config.client_ca_file", f"required by {raw}")
    return auth


def _versions(section: Mapping[str, Any], path: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    low = _tls_version(section, "min_version", path) or ssl.TLSVersion.TLSv1_2
    high = _tls_version(section, "max_version", path) or ssl.TLSVersion.TLSv1_3
    if high < low:
        raise ConfigError(path, "tls_server_config.max_version", "lower than min_version")
    return low, high


def _tls_version(section: Mapping[str, Any], key: str, path: str) -> ssl.TLSVersion | None:
    raw = _string(section, key, path, "tls_server_config")
    if raw is None:
        return None
    if raw not in _TLS_VERSIONS:
        reason = f"unknown TLS version {raw!r} (one of {', '.join(_TLS_VERSIONS)})"
        raise ConfigError(path, f"tls_server_config.{key}", reason)
    return _TLS_VERSIONS[raw]


def _ciphers(section: Mapping[str, Any], path: str) -> tuple[str, ...]:
    names = _string_list(section, "cipher_suites", path, "tls_server_config")
    mapped: list[str] = []
    for name in names:
        if name in _TLS13_CIPHERS:
            continue
        if name not in _CIPHERS:
            reason = f"unknown cipher {name!r}"
            raise ConfigError(path, "tls_server_config.cipher_suites", reason)
        mapped.append(_CIPHERS[name])
    return tuple(dict.fromkeys(mapped))


def _curve(section: Mapping[str, Any], path: str) -> str | None:
    names = _string_list(section, "curve_preferences", path, "tls_server_config")
    where = "tls_server_config.curve_preferences"
    for name in names:
        if name not in _CURVES:
            raise ConfigError(path, where, f"unknown curve {name!r}")
    if len(names) > 1:
        reason = f"at most one curve is supported by Python's ssl, got {len(names)}"
        raise ConfigError(path, where, reason)
    return _CURVES[names[0]] if names else None


def _parse_headers(value: object, path: str) -> tuple[tuple[str, str], ...]:
    section = _mapping(value, path, "http_server_config.headers")
    canonical = {name.lower(): name for name in _HEADERS}
    headers: list[tuple[str, str]] = []
    for raw_name, raw_value in section.items():
        where = f"http_server_config.headers.{_key_name(raw_name)}"
        name = canonical.get(str(raw_name).lower())
        if name is None:
            raise ConfigError(path, where, "header cannot be configured")
        if not isinstance(raw_value, str) or not raw_value.isprintable():
            raise ConfigError(path, where, "must be a single-line string")
        allowed = _HEADERS[name]
        if allowed and raw_value.lower() not in allowed:
            raise ConfigError(path, where, f"must be one of {', '.join(allowed)}")
        headers.append((name, raw_value))
    return tuple(headers)


def _parse_users(value: object, path: str) -> dict[str, str]:
    section = _mapping(value, path, "basic_auth_users")
    users: dict[str, str] = {}
    for user, hashed in section.items():
        where = f"basic_auth_users.{_key_name(user)}"
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(path, where, "user names must be non-empty strings without ':'")
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            reason = "not a bcrypt hash ($2a$, $2b$ or $2y$); plaintext passwords are refused"
            raise ConfigError(path, where, reason)
        users[user] = hashed
    return users


def _parse_rate_limit(section: Mapping[str, Any], path: str) -> RateLimit | None:
    _reject_unknown(section, _RATE_KEYS, path, "rate_limit")
    if section.get("interval") is None:
        return None
    try:
        interval = parse_duration(section["interval"])
    except ValueError as exc:
        raise ConfigError(path, "rate_limit.interval", str(exc)) from None
    burst = section.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
        raise ConfigError(path, "rate_limit.burst", "must be an integer of at least 1")
    if interval <= 0:
        return None
    return RateLimit(interval, burst)


def _mapping(value: object, path: str, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, where, f"must be a mapping, not {type(value).__name__}")
    return value


def _reject_unknown(
    section: Mapping[str, Any], allowed: tuple[str, ...], path: str, where: str
) -> None:
    for key in section:
        if key not in allowed:
            name = _key_name(key)
            raise ConfigError(path, f"{where}.{name}" if where else name, "unknown key")


def _key_name(key: object) -> str:
    # Keys land in a one-line message: show odd ones (newlines, non-strings) quoted.
    return key if isinstance(key, str) and key.isprintable() and key else repr(key)


def _string(section: Mapping[str, Any], key: str, path: str, where: str) -> str | None:
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(path, f"{where}.{key}", "must be a string")
    return value


def _string_list(section: Mapping[str, Any], key: str, path: str, where: str) -> list[str]:
    value = section.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(path, f"{where}.{key}", "must be a list of strings")
    return value


def _bool(section: Mapping[str, Any], key: str, default: bool, path: str, where: str) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(path, f"{where}.{key}", "must be true or false")
    return value


def _join(base: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base, path)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# --- reloading --------------------------------------------------------------------------------


class WebConfigWatch:
    """The web config file and its TLS files, re-read by ``refresh()`` when they change.

    ``refresh()`` does the file I/O (a stat of the config file and of the certificate, key
    and CA files; a re-read when one changed); the web server calls it once a second off the
    event loop. ``current()`` and ``tls_files`` only read what the last refresh found, so no
    request or handshake waits on the filesystem. While the file on disk is invalid,
    ``current()`` raises and ``last_good`` keeps the last valid version; both edges are
    logged once.
    """

    def __init__(self, path: str | None, initial: WebConfig) -> None:
        self._path = path
        self._signature = file_identity(path)
        self._good = initial
        self._error: ConfigError | None = None
        self._lock = threading.Lock()
        self._tls_files = _tls_identities(initial.tls)

    @property
    def last_good(self) -> WebConfig:
        """The last valid config, whatever the file holds now."""
        return self._good

    @property
    def tls_files(self) -> tuple[FileIdentity | None, ...]:
        """The certificate, key and CA files as the last refresh saw them (size, mtime, inode)."""
        return self._tls_files

    def current(self) -> WebConfig:
        """The config as the file held it at the last refresh.

        Raises:
            ConfigError: the file is now invalid (the server answers 500 until it is fixed).
        """
        if self._error is not None:
            raise self._error
        return self._good

    def refresh(self) -> None:
        """Look at the files again; reload the config when its file changed."""
        with self._lock:
            if self._path is not None:
                signature = file_identity(self._path)
                if signature != self._signature:
                    self._reload(self._path, signature)
            self._tls_files = _tls_identities(self._good.tls)

    def _reload(self, path: str, signature: FileIdentity | None) -> None:
        self._signature = signature
        try:
            config = load_web_config(path)
            if (config.tls is None) != (self._good.tls is None):
                raise ConfigError(
                    path, "tls_server_config", "turning TLS on or off needs a restart"
                )
        except ConfigError as exc:
            if self._error is None or str(exc) != str(self._error):
                log.error("web config invalid, answering 500 until fixed error=%r", str(exc))
            self._error = exc
            return
        if self._error is not None or config != self._good:
            log.info("web config reloaded path=%s", path)
        self._good, self._error = config, None


def _tls_identities(tls: TlsSettings | None) -> tuple[FileIdentity | None, ...]:
    if tls is None:
        return ()
    return tuple(file_identity(f) for f in (tls.cert_file, tls.key_file, tls.client_ca_file))


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


# --- basic auth -------------------------------------------------------------------------------


def parse_basic_authorization(header: str | None) -> tuple[str, bytes] | None:
    """``(user, password)`` from an ``Authorization: Basic`` header, or None if malformed."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
        user, sep, password = decoded.partition(b":")
        return (user.decode("utf-8"), password) if sep else None
    except (binascii.Error, UnicodeDecodeError):
        return None


@functools.lru_cache(maxsize=8)
def _fake_hash(cost: int) -> bytes:
    return bcrypt.hashpw(b"not-a-user-password", bcrypt.gensalt(rounds=cost))


class BasicAuthUsers:
    """bcrypt checks of ``basic_auth_users`` with a cache of successful checks.

    Unknown users are compared against a fake hash of the same cost, so response time does
    not reveal which users exist. The cache is keyed by an HMAC of user, stored hash and
    password under a per-process secret, so a cached right password never admits a wrong
    one (CVE-2022-46146) and the cache holds no usable password digests.
    """

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {user: hashed.encode("ascii") for user, hashed in users.items()}
        costs = [int(m.group(1)) for h in users.values() if (m := _BCRYPT_HASH.match(h))]
        self._cost = max(costs, default=10)
        self._secret = secrets.token_bytes(32)
        self._ok: dict[bytes, None] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._users)

    @functools.cached_property
    def slowest_check_seconds(self) -> float:
        """How long one check at the highest cost in the file takes (measured once, here).

        Every answer is padded to it, so neither an unknown user (checked against a fake hash
        of that cost) nor a known user with a cheaper hash stands out by its timing.
        """
        started = time.perf_counter()
        bcrypt.checkpw(b"timing", _fake_hash(self._cost))
        return time.perf_counter() - started

    def cached(self, user: str, password: bytes) -> bool:
        """True when this exact (user, hash, password) was verified before; cheap."""
        hashed = self._users.get(user)
        if hashed is None:
            return False
        with self._lock:
            return self._cache_key(user, hashed, password) in self._ok

    def verify(self, user: str, password: bytes) -> bool:
        """Full bcrypt check (tens of milliseconds); remembers successes."""
        hashed = self._users.get(user)
        candidate = hashed if hashed is not None else _fake_hash(self._cost)
        too_long = len(password) > _BCRYPT_MAX_PASSWORD
        try:
            # bcrypt refuses passwords over 72 bytes; still spend the time of one check.
            ok = bcrypt.checkpw(password[:_BCRYPT_MAX_PASSWORD], candidate)
        except ValueError:
            ok = False
        if not ok or too_long or hashed is None:
            return False
        with self._lock:
            if len(self._ok) >= _AUTH_CACHE_SIZE:
                self._ok.pop(next(iter(self._ok)))
            self._ok[self._cache_key(user, hashed, password)] = None
        return True

    def _cache_key(self, user: str, hashed: bytes, password: bytes) -> bytes:
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        for part in (user.encode("utf-8"), hashed, password):
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        return mac.digest()
