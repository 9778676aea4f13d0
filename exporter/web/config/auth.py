"""Basic auth: the ``Authorization`` header and bcrypt checks of ``basic_auth_users``."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Final

import bcrypt

#: What ``basic_auth_users`` accepts: a bcrypt hash, its cost in the first group.
BCRYPT_HASH: Final = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
_BCRYPT_MAX_PASSWORD: Final = 72
_AUTH_CACHE_SIZE: Final = 100


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
        costs = [int(m.group(1)) for h in users.values() if (m := BCRYPT_HASH.match(h))]
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
