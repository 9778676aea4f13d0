"""The web-config.yml parser, basic-auth checks and the reloading watch (no servers here)."""

from __future__ import annotations

import base64
import logging
import os
import ssl
import time
from pathlib import Path

import bcrypt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.base.errors import ConfigError
from exporter.web.config import (
    BasicAuthUsers,
    ClientAuthType,
    RateLimit,
    WebConfig,
    WebConfigWatch,
    load_web_config,
    parse_basic_authorization,
    parse_web_config,
    peer_allowed,
)

CERTS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"


def write(tmp_path: Path, text: str, name: str = "web.yml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    return message.removeprefix(f"{path}: ")


def htpasswd_hash(password: bytes, rounds: int = 4) -> str:
    """A hash as `htpasswd -nBC N` writes it: the $2y$ prefix."""
    return "$2y$" + bcrypt.hashpw(password, bcrypt.gensalt(rounds)).decode()[4:]


# --- one bad file per error, with its exact message (RELIABILITY.md A1, A2, A7, A9, A12, A13)


BAD_FILES = [
    ("tls_config:\n  cert_file: a\n", "tls_config: unknown key"),
    (CERTS + "  client_auth: x\n", "tls_server_config.client_auth: unknown key"),
    ("http_server_config:\n  header: {}\n", "http_server_config.header: unknown key"),
    ("rate_limit:\n  every: 1s\n", "rate_limit.every: unknown key"),
    (
        "basic_auth_users:\n  alice: hunter2\n",
        "basic_auth_users.alice: not a bcrypt hash ($2a$, $2b$ or $2y$); "
        "plaintext passwords are refused",
    ),
    (
        CERTS + "  client_ca_file: ca.crt\n",
        "tls_server_config.client_auth_type: client CA configured without a client auth type",
    ),
    (
        CERTS + "  client_auth_type: RequireAndVerifyClientCert\n",
        "tls_server_config.client_ca_file: required by RequireAndVerifyClientCert",
    ),
    (
        CERTS + "  client_auth_type: Sometimes\n",
        "tls_server_config.client_auth_type: unknown value 'Sometimes'",
    ),
    (
        CERTS
        + "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_RSA_WITH_RC4_128_SHA]\n",
        "tls_server_config.cipher_suites: unknown cipher 'TLS_RSA_WITH_RC4_128_SHA'",
    ),
    (
        CERTS + "  curve_preferences: [CurveP256, Curve448]\n",
        "tls_server_config.curve_preferences: unknown curve 'Curve448'",
    ),
    (
        CERTS + "  curve_preferences: [X25519, CurveP256]\n",
        "tls_server_config.curve_preferences: at most one curve is supported by Python's ssl, "
        "got 2",
    ),
    (
        CERTS + "  min_version: TLS14\n",
        "tls_server_config.min_version: unknown TLS version 'TLS14' (one of TLS10, TLS11, TLS12, "
        "TLS13)",
    ),
    (
        CERTS + "  min_version: TLS13\n  max_version: TLS12\n",
        "tls_server_config.max_version: lower than min_version",
    ),
    (
        "tls_server_config:\n  cert_file: a.crt\n",
        "tls_server_config.key_file: required when TLS is configured",
    ),
    (
        "tls_server_config:\n  min_version: TLS13\n",
        "tls_server_config.cert_file: required when TLS is configured",
    ),
    (
        CERTS + "  cert: '-----BEGIN CERTIFICATE-----'\n",
        "tls_server_config.cert: inline certificates are not supported; use cert_file",
    ),
    (
        CERTS + "  client_allowed_sans: [scraper]\n",
        "tls_server_config.client_allowed_sans: requires client_auth_type: "
        "RequireAndVerifyClientCert",
    ),
    (
        "http_server_config:\n  headers:\n    Server: nginx\n",
        "http_server_config.headers.Server: header cannot be configured",
    ),
    (
        "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
        "http_server_config.headers.X-Frame-Options: must be one of deny, sameorigin",
    ),
    (
        "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
        "http_server_config.headers.X-Content-Type-Options: must be one of nosniff",
    ),
    (
        "rate_limit:\n  interval: 1s\n  burst: 0\n",
        "rate_limit.burst: must be an integer of at least 1",
    ),
    (
        "rate_limit:\n  interval: soon\n  burst: 1\n",
        "rate_limit.interval: 'soon' is not a duration such as 10s or 1m30s",
    ),
    ("http_server_config:\n  http2: maybe\n", "http_server_config.http2: must be true or false"),
    ("- a\n- b\n", "must be a mapping, not list"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_FILES, ids=[e for _, e in BAD_FILES])
def test_bad_file_is_one_line_naming_the_key(tmp_path, text, expected):
    assert error_of(tmp_path, text) == expected


@pytest.mark.parametrize(
    "value", ["RequireAnyClientCert", "RequestClientCert", "RequireClientCert"]
)
def test_client_auth_that_python_cannot_enforce_is_refused_by_name(tmp_path, value):
    message = error_of(tmp_path, CERTS + f"  client_ca_file: ca.crt\n  client_auth_type: {value}\n")
    assert message.startswith(f"tls_server_config.client_auth_type: {value} cannot be enforced")


def test_invalid_yaml_and_missing_file_are_one_line(tmp_path):
    assert error_of(tmp_path, "tls_server_config: [\n").startswith("invalid YAML: ")
    with pytest.raises(ConfigError, match=r"nope\.yml: cannot read: No such file"):
        load_web_config(str(tmp_path / "nope.yml"))


# --- what good files become


def test_empty_file_serves_plain_http_without_auth(tmp_path):
    config = load_web_config(write(tmp_path, ""))
    assert config.tls is None
    assert config.basic_auth_users == {}
    assert config.headers == ()
    assert config.rate_limit is None


def test_relative_paths_resolve_against_the_config_directory(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    monkeypatch.chdir("/")
    text = CERTS + "  client_ca_file: ../ca/ca.crt\n  client_auth_type: VerifyClientCertIfGiven\n"
    config = load_web_config(write(tmp_path / "conf", text))
    assert config.tls is not None
    assert config.tls.cert_file == str(tmp_path / "conf" / "server.crt")
    assert config.tls.client_ca_file == str(tmp_path / "conf" / "../ca/ca.crt")
    assert config.tls.client_auth_type is ClientAuthType.VERIFY_CLIENT_CERT_IF_GIVEN


def test_absolute_paths_are_kept(tmp_path):
    text = "tls_server_config:\n  cert_file: /etc/x/s.crt\n  key_file: /etc/x/s.key\n"
    config = load_web_config(write(tmp_path, text))
    assert config.tls is not None
    assert (config.tls.cert_file, config.tls.key_file) == ("/etc/x/s.crt", "/etc/x/s.key")


def test_tls_names_map_to_openssl(tmp_path):
    text = CERTS + (
        "  min_version: TLS13\n"
        "  cipher_suites: [TLS_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,\n"
        "                  TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256]\n"
        "  curve_preferences: [CurveP384]\n"
        "  prefer_server_cipher_suites: false\n"
    )
    tls = load_web_config(write(tmp_path, text)).tls
    assert tls is not None
    assert tls.min_version is ssl.TLSVersion.TLSv1_3
    assert tls.max_version is ssl.TLSVersion.TLSv1_3
    # TLS 1.3 suites are accepted and, as in Go, not configurable.
    assert tls.ciphers == ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305")
    assert tls.curve == "secp384r1"
    assert tls.prefer_server_cipher_suites is False


def test_headers_rate_limit_and_users(tmp_path):
    hashed = htpasswd_hash(b"pw")
    text = (
        "http_server_config:\n  http2: false\n  headers:\n"
        "    x-frame-options: DENY\n    Strict-Transport-Security: max-age=31536000\n"
        f"basic_auth_users:\n  alice: '{hashed}'\n"
        "rate_limit:\n  interval: 500ms\n  burst: 3\n"
    )
    config = load_web_config(write(tmp_path, text))
    assert config.headers == (
        ("X-Frame-Options", "DENY"),
        ("Strict-Transport-Security", "max-age=31536000"),
    )
    assert config.basic_auth_users == {"alice": hashed}
    assert config.rate_limit == RateLimit(0.5, 3)
    assert config.http2 is False


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "tls_server_config",
                        "http_server_config",
                        "basic_auth_users",
                        "rate_limit",
                        "cert_file",
                        "key_file",
                        "client_auth_type",
                        "client_ca_file",
                        "cipher_suites",
                        "curve_preferences",
                        "min_version",
                        "headers",
                        "interval",
                        "burst",
                        "X-Frame-Options",
                        "alice",
                    ]
                )
                | st.text(max_size=6),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_parser_only_ever_raises_config_error(data):
    try:
        config = parse_web_config(data, "/fuzz/web.yml")
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(config, WebConfig)


# --- basic auth (A3 to A6)


def header(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


def test_authorization_header_parsing():
    assert parse_basic_authorization(header("alice", b"p:w")) == ("alice", b"p:w")
    assert parse_basic_authorization("basic " + base64.b64encode(b"bob:").decode()) == ("bob", b"")
    assert parse_basic_authorization(None) is None
    assert parse_basic_authorization("Bearer abc") is None
    assert parse_basic_authorization("Basic !!!") is None
    assert parse_basic_authorization("Basic " + base64.b64encode(b"no-colon").decode()) is None


def test_htpasswd_2y_hash_and_right_password_pass():
    users = BasicAuthUsers({"alice": htpasswd_hash(b"right")})
    assert users.verify("alice", b"right")
    assert not users.verify("alice", b"wrong")
    assert not users.verify("mallory", b"right")


def test_password_over_72_bytes_is_refused_not_an_error():
    long = b"x" * 100
    users = BasicAuthUsers({"alice": htpasswd_hash(long[:72])})
    assert users.verify("alice", long[:72])
    # bcrypt would accept the truncation; a longer password is a different password.
    assert not users.verify("alice", long)
    assert not users.verify("nobody", long)


def test_cached_right_password_does_not_admit_a_wrong_one():
    """CVE-2022-46146: the cache must be keyed by the password too."""
    users = BasicAuthUsers({"alice": htpasswd_hash(b"right")})
    assert not users.cached("alice", b"right")
    assert users.verify("alice", b"right")
    assert users.cached("alice", b"right")
    assert not users.cached("alice", b"wrong")
    assert not users.verify("alice", b"wrong")
    assert not users.cached("mallory", b"right")


def test_unknown_user_costs_a_full_bcrypt_check():
    """User names must not be enumerable by timing (A4): compare against a fake hash."""
    users = BasicAuthUsers({"alice": htpasswd_hash(b"right", rounds=10)})
    users.verify("warm-up", b"x")  # builds the fake hash once

    def best_of_three(user: str) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            assert not users.verify(user, b"wrong")
            times.append(time.perf_counter() - started)
        return min(times)

    known, unknown = best_of_three("alice"), best_of_three("mallory")
    # Without the fake compare an unknown user takes microseconds, not ~70 ms.
    assert unknown > known / 3


# --- client_allowed_sans


def test_peer_allowed_matches_any_san_exactly():
    cert = {"subjectAltName": (("DNS", "scraper.example"), ("IP Address", "2001:DB8:0:0:0:0:0:1"))}
    assert peer_allowed(cert, ("scraper.example",))
    assert peer_allowed(cert, ("2001:db8::1",))
    assert not peer_allowed(cert, ("other.example", "scraper"))
    assert not peer_allowed(None, ("scraper.example",))
    assert peer_allowed(None, ())


# --- reloading (A16)


def replace_file(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def test_watch_reloads_reports_invalid_once_and_recovers(tmp_path, caplog):
    good = "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    path = write(tmp_path, good)
    watch = WebConfigWatch(path, load_web_config(path))
    assert watch.current().headers == (("X-Frame-Options", "deny"),)

    caplog.set_level(logging.INFO, logger="exporter.web.config")
    replace_file(path, "http_server_config:\n  headers:\n    X-Frame-Options: allow\n")
    assert watch.current().headers == (("X-Frame-Options", "deny"),)  # until a refresh looks
    for _ in range(3):
        watch.refresh()
        with pytest.raises(ConfigError, match="must be one of deny, sameorigin"):
            watch.current()
    assert watch.last_good.headers == (("X-Frame-Options", "deny"),)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "X-Frame-Options" in errors[0].getMessage()

    replace_file(path, "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n")
    watch.refresh()
    assert watch.current().headers == (("X-Frame-Options", "sameorigin"),)
    assert "web config reloaded" in caplog.records[-1].getMessage()


def test_a_request_reads_no_file_only_what_the_last_refresh_found(tmp_path):
    path = write(tmp_path, "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    watch = WebConfigWatch(path, load_web_config(path))
    os.unlink(path)  # a stat now would find it gone and answer 500
    assert watch.current().headers == (("X-Frame-Options", "deny"),)


def test_watch_refuses_turning_tls_on_at_runtime(tmp_path):
    path = write(tmp_path, "")
    watch = WebConfigWatch(path, load_web_config(path))
    replace_file(path, CERTS)
    watch.refresh()
    with pytest.raises(ConfigError, match="turning TLS on or off needs a restart"):
        watch.current()
