"""Host memory pressure from Linux PSI (``/proc/pressure/memory``).

A host that is about to OOM-kill an engine shows it here first: tasks stalling on reclaim.
Beside a cold start that slows down, that is the evidence which tells memory starvation
from a slow disk. Kernels without PSI (before 4.20, or booted with ``psi=0``) lack the file:
the source then reads as absent (``not_supported``), not down, and nothing else changes.
"""

from __future__ import annotations

import errno
from typing import Final

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import MemoryPressure

PSI_MEMORY: Final = "/proc/pressure/memory"
#: No config key turns this source on or off: the kernel decides.
NO_PSI_HINT: Final = (
    "no PSI in this kernel (before 4.20, or booted with psi=0): boot with psi=1 to turn it on; "
    "nothing else depends on it"
)
_PERCENT: Final = 100.0
_MICROSECONDS: Final = 1e6


def parse_psi(text: str) -> MemoryPressure:
    """Parse the ``some`` and ``full`` lines of a PSI file.

    Raises:
        ValueError: a line or field is missing or not a number.
    """
    fields: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        pairs = (item.split("=", 1) for item in rest.split())
        fields[kind] = {key: float(value) for key, value in pairs}
    try:
        some, full = fields["some"], fields["full"]
        return MemoryPressure(
            some_ratio=some["avg10"] / _PERCENT,
            full_ratio=full["avg10"] / _PERCENT,
            some_seconds=some["total"] / _MICROSECONDS,
            full_seconds=full["total"] / _MICROSECONDS,
        )
    except KeyError as exc:
        raise ValueError(f"PSI field {exc} missing") from exc


class MemoryPressureSource:
    """Samples the host's memory pressure once a tick (one small read of a procfs file)."""

    name: Final = "memory_pressure"

    def __init__(self, path: str = PSI_MEMORY) -> None:
        self._path = path

    def sample(self, deadline: float | None = None) -> MemoryPressure:
        """The pressure now.

        Raises:
            SourceAbsent: no PSI on this kernel ("not_supported").
            SourceError: the file is unreadable ("permission_denied") or not in PSI's format
                ("malformed").
        """
        try:
            with open(self._path, encoding="ascii") as fh:
                text = fh.read(4096)
        except FileNotFoundError as exc:
            raise SourceAbsent(
                "not_supported", f"{self._path} is missing", hint=NO_PSI_HINT
            ) from exc
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise SourceError("permission_denied", str(exc)) from exc
            if exc.errno == errno.EOPNOTSUPP:  # the file exists but psi=0 disabled it
                raise SourceAbsent("not_supported", str(exc), hint=NO_PSI_HINT) from exc
            raise
        try:
            return parse_psi(text)
        except ValueError as exc:
            raise SourceError("malformed", str(exc)) from exc

    def close(self) -> None:
        """Nothing to release: each sample opens and closes the file."""
