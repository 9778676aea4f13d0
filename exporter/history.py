"""The sqlite store of past cold starts, and of the one in progress (for exporter restarts).

It answers what the lifecycle core learns from: typical phase durations (ETA), the longest
quiet stretch per phase (learned stall thresholds) and the last peak GPU memory. A corrupt
store is set aside once with one log line; an unwritable one degrades to memory. Neither stops
the daemon; ``errors`` counts failed writes for ``/metrics``.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Final

from exporter.core.lifecycle import ColdStart, SavedStart
from exporter.core.model import STARTUP_PHASES, Phase

log = logging.getLogger(__name__)
SCHEMA_VERSION: Final = 1
#: How many past successful starts feed the expectations.
RECENT_STARTS: Final = 10
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS cold_starts (
    target TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL NOT NULL,
    outcome TEXT NOT NULL, reason TEXT, engine TEXT, model TEXT,
    phase_seconds TEXT NOT NULL, longest_quiet TEXT NOT NULL,
    read_bytes INTEGER, peak_gpu_bytes INTEGER,
    PRIMARY KEY (target, started_at)
);
CREATE TABLE IF NOT EXISTS in_progress (
    target TEXT PRIMARY KEY, pid INTEGER NOT NULL, create_time REAL NOT NULL,
    phase TEXT NOT NULL, phase_since REAL, phase_seconds TEXT NOT NULL,
    progress_ratio REAL, saved_at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Expectations:
    """What history says about a target's next cold start; empty when it has none."""

    phase_seconds: dict[Phase, float] = field(default_factory=dict)
    longest_quiet: dict[Phase, float] = field(default_factory=dict)
    peak_gpu_bytes: int | None = None
    typical_duration_seconds: float | None = None
    starts: int = 0


class History:
    """Cold starts in sqlite (``STATE_DIR/history.sqlite``), or in memory when that fails."""

    def __init__(self, conn: sqlite3.Connection, path: str | None) -> None:
        self._conn = conn
        self.path = path
        self.errors = 0
        self.in_memory = path is None

    @classmethod
    def open(cls, state_directory: str | None) -> History:
        """Open (creating) the store in a state directory; fall back to memory on failure."""
        if state_directory is None:
            return cls(_connect(":memory:"), None)
        path = os.path.join(state_directory, "history.sqlite")
        try:
            os.makedirs(state_directory, mode=0o700, exist_ok=True)
            return cls(_connect(path), path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
                return cls._memory(path, "cannot open")
            aside = f"{path}.corrupt-{int(time.time())}"
            log.error(
                "history store unreadable, set aside path=%s moved_to=%s error=%s", path, aside, exc
            )
            try:
                os.replace(path, aside)
                return cls(_connect(path), path)
            except (OSError, sqlite3.DatabaseError):
                return cls._memory(path, "cannot recreate")
        except OSError as exc:
            return cls._memory(path, exc.strerror or "cannot create directory")

    @classmethod
    def _memory(cls, path: str, why: str) -> History:
        log.error("history store unusable, keeping history in memory path=%s reason=%r", path, why)
        store = cls(_connect(":memory:"), None)
        store.errors += 1
        return store

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        try:
            with self._conn:
                self._conn.execute(sql, args)
        except sqlite3.Error as exc:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.error("history write failed errors=%d error=%s", self.errors, exc)

    def _read(self, sql: str, args: tuple[object, ...]) -> list[Any]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.error("history read failed errors=%d error=%s", self.errors, exc)
            return []

    def record(self, target: str, engine: str, model: str, cold: ColdStart) -> None:
        """Store one finished cold start."""
        self._write(
            "INSERT OR REPLACE INTO cold_starts VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                target,
                cold.started_at,
                cold.ended_at,
                cold.outcome,
                cold.reason,
                engine,
                model,
                _dump(cold.phase_seconds),
                _dump(cold.longest_quiet_seconds),
                cold.read_bytes,
                cold.peak_gpu_bytes,
            ),
        )

    def starts(self, target: str, limit: int = 50) -> list[ColdStart]:
        """The target's most recent cold starts, newest first; none when the store fails."""
        rows = self._read(
            "SELECT started_at, ended_at, outcome, reason, phase_seconds, longest_quiet, "
            "read_bytes, peak_gpu_bytes FROM cold_starts WHERE target=? "
            "ORDER BY started_at DESC LIMIT ?",
            (target, limit),
        )
        return [
            ColdStart(r[0], r[1], r[2], r[3], _load(r[4]), _load(r[5]), r[6], r[7]) for r in rows
        ]

    def expectations(self, target: str) -> Expectations:
        """Median phase durations, longest quiet stretches and last peak of good starts."""
        good = [c for c in self.starts(target, RECENT_STARTS * 3) if c.outcome == "ready"]
        good = good[:RECENT_STARTS]
        if not good:
            return Expectations()
        phases = {
            p: statistics.median([dict(c.phase_seconds).get(p, 0.0) for c in good])
            for p in STARTUP_PHASES
        }
        quiet = {
            p: max(dict(c.longest_quiet_seconds).get(p, 0.0) for c in good) for p in STARTUP_PHASES
        }
        return Expectations(
            phase_seconds=phases,
            longest_quiet=quiet,
            peak_gpu_bytes=good[0].peak_gpu_bytes,
            typical_duration_seconds=statistics.median(c.duration_seconds for c in good),
            starts=len(good),
        )

    def save_progress(self, saved: SavedStart) -> None:
        """Remember a cold start in progress, or forget it once it finished."""
        if not saved.in_progress:
            self._write("DELETE FROM in_progress WHERE target=?", (saved.target,))
            return
        self._write(
            "INSERT OR REPLACE INTO in_progress VALUES (?,?,?,?,?,?,?,?)",
            (
                saved.target,
                saved.pid,
                saved.create_time,
                saved.phase.value,
                saved.phase_since,
                _dump(saved.phase_seconds),
                saved.progress_ratio,
                time.time(),
            ),
        )

    def saved_start(self, target: str) -> SavedStart | None:
        """The saved in-progress start of a target, if any (``lifecycle.resume`` continues it)."""
        rows = self._read(
            "SELECT pid, create_time, phase, phase_since, phase_seconds, progress_ratio "
            "FROM in_progress WHERE target=?",
            (target,),
        )
        if not rows:
            return None
        pid, create_time, phase, phase_since, phase_seconds, progress_ratio = rows[0]
        try:
            return SavedStart(
                target,
                pid,
                create_time,
                Phase(phase),
                phase_since,
                _load(phase_seconds),
                progress_ratio,
            )
        except ValueError:
            return None

    def close(self) -> None:
        """Close the database."""
        self._conn.close()


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=1.0, check_same_thread=False)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version} is newer than {SCHEMA_VERSION}")
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        conn.execute("PRAGMA journal_mode=WAL")
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _dump(pairs: tuple[tuple[Phase, float], ...]) -> str:
    return json.dumps({p.value: s for p, s in pairs})


def _load(text: str) -> tuple[tuple[Phase, float], ...]:
    try:
        data = json.loads(text)
        return tuple((Phase(k), float(v)) for k, v in data.items())
    except (ValueError, TypeError, AttributeError):
        return ()
