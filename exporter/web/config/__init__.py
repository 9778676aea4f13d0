"""The exporter-toolkit ``web-config.yml`` format: parsing, TLS contexts and basic-auth checks.

Reads files and builds ``ssl`` contexts; serves nothing (``web`` does). ``schema`` holds the
values, ``reader`` turns the file into them, ``watch`` looks at the files again once a second,
``tls`` builds the contexts and checks client SANs, ``auth`` checks basic-auth passwords.
"""

from exporter.web.config.auth import BasicAuthUsers, parse_basic_authorization
from exporter.web.config.reader import load_web_config, parse_web_config
from exporter.web.config.schema import ClientAuthType, RateLimit, TlsSettings, WebConfig
from exporter.web.config.tls import (
    ReloadingSSLContext,
    build_ssl_context,
    peer_allowed,
    validate_web_config,
)
from exporter.web.config.watch import WebConfigWatch

__all__ = [
    "BasicAuthUsers",
    "ClientAuthType",
    "RateLimit",
    "ReloadingSSLContext",
    "TlsSettings",
    "WebConfig",
    "WebConfigWatch",
    "build_ssl_context",
    "load_web_config",
    "parse_basic_authorization",
    "parse_web_config",
    "peer_allowed",
    "validate_web_config",
]
