"""The exporter's exception hierarchy.

    ExporterError
     +-- ConfigError      bad config file or flags: names file, field and reason; exit 2
     +-- SourceError      a source could not observe (NVML error, unreadable journal)
          +-- SourceAbsent   what it reads is not on this host (no NVIDIA library, no PSI)

Sources never let a SourceError escape into the loop: their wrapper turns it into data.
"""

from __future__ import annotations


class ExporterError(Exception):
    """Base class of every error the exporter raises on purpose."""


class ConfigError(ExporterError):
    """One problem in a config file or flag, rendered as ``file: field: reason``."""

    def __init__(self, path: str, field: str, reason: str) -> None:
        self.path = path
        self.field = field
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}: {self.field}" if self.field else self.path
        return f"{where}: {self.reason}"


class ConfigErrors(ExporterError):
    """Every problem found in one config file, one ConfigError each."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class SourceError(ExporterError):
    """A source could not observe; ``reason`` is a bounded, label-safe word."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class SourceAbsent(SourceError):
    """What a source reads is simply not on this host: node_exporter's ``ErrNoData``.

    Not a failure: the source reads as ``absent``, never as down. ``hint`` says what is
    missing and the config key that turns the source on or off; it is logged once.
    """

    def __init__(self, reason: str, detail: str = "", *, hint: str) -> None:
        self.hint = hint
        super().__init__(reason, detail)
