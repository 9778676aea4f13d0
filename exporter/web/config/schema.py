"""A web config's values, as the reader makes them: frozen, checked, paths absolute."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class ClientAuthType(StrEnum):
    """The ``client_auth_type`` values that Python's ``ssl`` can enforce."""

    NO_CLIENT_CERT = "NoClientCert"
    VERIFY_CLIENT_CERT_IF_GIVEN = "VerifyClientCertIfGiven"
    REQUIRE_AND_VERIFY_CLIENT_CERT = "RequireAndVerifyClientCert"


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
