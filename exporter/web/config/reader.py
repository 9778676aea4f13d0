"""Reading ``web-config.yml``: YAML -> a checked ``WebConfig``, one-line errors naming the key.

What Python's ``ssl`` cannot enforce is rejected by name instead of being silently ignored.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from typing import Any, Final

import yaml

from exporter.base.errors import ConfigError
from exporter.config import parse_duration
from exporter.web.config.auth import BCRYPT_HASH
from exporter.web.config.schema import ClientAuthType, RateLimit, TlsSettings, WebConfig

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
        raise ConfigError(path, "", f"invalid YAML: {one_line(exc)}") from exc
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
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
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


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (it lands in a one-line error), else its type."""
    return " ".join(str(exc).split()) or type(exc).__name__
