"""The sqlite store of past cold starts, and of the one in progress (for exporter restarts).

It answers what the lifecycle core learns from: typical phase durations (ETA), the longest
quiet stretch per phase (learned stall thresholds) and the last peak GPU memory. A corrupt
store is set aside once with one log line; an unwritable one degrades to memory. Neither stops
the daemon; ``errors`` counts failed writes for ``/metrics``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from exporter.base.files import FileIdentity, file_identity
from exporter.base.model import STARTUP_PHASES, Phase
from exporter.base.records import ColdStart, SavedStart, StartOutcome

log = logging.getLogger(__name__)
#: After the store was lost (deleted, truncated, corrupt), ``source_up{source="history"}``
#: stays 0 this long although writing works again, so the 5-minute alert can fire.
LOSS_VISIBLE_SECONDS: Final = 600.0
#: Finished cold starts kept in memory (the newest of the store's at open, then each one
#: recorded), to write again into a store that replaced a lost one.
KEPT_STARTS: Final = 200
#: What every sqlite database file begins with; anything else there is no store any more.
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
#: sqlite's codes for a file that is not (or no longer) a database.
_CORRUPT_CODES: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
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


class _Kept(NamedTuple):
    """A recorded start as kept in memory, with the labels its row carries."""

    target: str
    engine: str
    model: str
    cold: ColdStart


@dataclass(frozen=True, slots=True)
class Expectations:
    """What history says about a target's next cold start; empty when it has none."""

    phase_seconds: dict[Phase, float] = field(default_factory=dict)
    longest_quiet: dict[Phase, float] = field(default_factory=dict)
    peak_gpu_bytes: int | None = None
    typical_duration_seconds: float | None = None
    #: The 95th percentile of recent good starts (the longest one with fewer than 20).
    p95_duration_seconds: float | None = None
    starts: int = 0


class History:
    """Cold starts in sqlite (``STATE_DIR/history.sqlite``), or in memory when that fails."""

    def __init__(self, conn: sqlite3.Connection, path: str | None) -> None:
        self._conn = conn
        self.path = path
        self.errors = 0
        self.in_memory = path is None
        #: Why the store is not keeping history now (sticky until fixed), or None.
        self.problem: str | None = None
        self._lost_at: float | None = None
        self._identity = file_identity(path)
        #: The file as it was when its header last read as sqlite's: unchanged, not read again.
        self._header_read_at: FileIdentity | None = None
        self._kept: list[_Kept] = []
        #: Recorded starts a failed write (a full disk) left out: written once writes work.
        self._unwritten: list[_Kept] = []
        self._progress: dict[str, SavedStart] = {}
        #: What the store is known to hold per target (None: no row): a tick whose start is
        #: unchanged writes nothing, where a commit per target per tick cost 0.5 ms each.
        self._written: dict[str, SavedStart | None] = {}
        if path is not None:  # what a store lost later, or overwritten, must not take along
            self._kept = self._newest()

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

    def _write(self, sql: str, args: tuple[object, ...]) -> bool:
        """Run one write in its own transaction; False when it failed (and was counted)."""
        try:
            with self._conn:
                self._conn.execute(sql, args)
        except sqlite3.Error as exc:
            self._failed("write", exc)
            return False
        if self.problem == "write_failed":
            log.info("history writes work again path=%s", self.path)
            self.problem = None
        return True

    def _failed(self, what: str, exc: sqlite3.Error) -> None:
        self.errors += 1
        if self.errors == 1 or self.errors % 100 == 0:
            log.error("history %s failed errors=%d error=%s", what, self.errors, exc)
        if getattr(exc, "sqlite_errorcode", None) in _CORRUPT_CODES:
            self._replace_lost("malformed")
        elif what == "write" and self.problem is None:
            self.problem = "write_failed"  # a full disk: down until a write works again

    def _read(self, sql: str, args: tuple[object, ...]) -> list[Any]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            self._failed("read", exc)
            return []

    def check(self, now: float | None = None) -> str | None:
        """Look for a store lost under the running daemon; the problem, None when healthy.

        Deleting the state directory leaves sqlite writing to unlinked files, and a truncated
        file is only noticed when a missing page is read: so compare the path with the file
        opened (device, inode, size never shrinking: sqlite does not shrink it without
        VACUUM). A lost store is set aside if still there and replaced by a new one holding
        what is in memory (this run's cold starts, the starts in progress); the problem stays
        reported for ``LOSS_VISIBLE_SECONDS``. A failed write stays a problem until one works,
        retried here.
        """
        now = time.monotonic() if now is None else now
        if self.path is None:
            return "in_memory"
        seen = file_identity(self.path)
        lost = _lost(self.path, self._identity, seen, self._header_read_at)
        if lost is not None:
            self._replace_lost(lost)
        elif self.problem == "write_failed":
            self._write_unwritten()
        else:
            self._identity = self._header_read_at = seen or self._identity
        if self._lost_at is not None and now - self._lost_at >= LOSS_VISIBLE_SECONDS:
            self._lost_at, self.problem = None, None
        return self.problem

    def _replace_lost(self, why: str) -> None:
        assert self.path is not None
        path = self.path
        log.error("history store lost, replacing it path=%s reason=%s", path, why)
        self._lost_at, self.problem = time.monotonic(), f"lost_{why}"
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            # A replaced file may be the operator's restored backup: write into it instead.
            if why != "replaced" and os.path.exists(path):
                os.replace(path, f"{path}.corrupt-{int(time.time())}")
                for suffix in ("-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path + suffix)
            self._conn = _connect(path)
        except (OSError, sqlite3.Error) as exc:
            log.error("history store cannot be recreated path=%s error=%s", path, exc)
            self._conn, self.path, self.in_memory = _connect(":memory:"), None, True
            self.problem = "in_memory"
        self._identity = file_identity(path)
        kept, progress = list(self._kept), list(self._progress.values())
        self._written = {}  # a new file holds nothing yet
        self._unwritten = [entry for entry in kept if not self._insert(entry)]
        for saved in progress:
            self.save_progress(saved)

    def record(self, target: str, engine: str, model: str, cold: ColdStart) -> None:
        """Store one finished cold start; one a failed write left out is written later."""
        entry = _Kept(target, engine, model, cold)
        self._kept = [*self._kept, entry][-KEPT_STARTS:]
        if not self._insert(entry):
            self._unwritten.append(entry)

    def _write_unwritten(self) -> None:
        """Retry the writes a failure left out (a probe write when there are none)."""
        if not self._unwritten:
            self._write("PRAGMA user_version=" + str(SCHEMA_VERSION), ())
        while self._unwritten and self._insert(self._unwritten[0]):
            self._unwritten.pop(0)

    def _newest(self) -> list[_Kept]:
        """The store's newest finished starts, oldest first, to keep in memory."""
        rows = self._read(
            "SELECT target, engine, model, started_at, ended_at, outcome, reason, "
            "phase_seconds, longest_quiet, read_bytes, peak_gpu_bytes FROM cold_starts "
            "ORDER BY started_at DESC LIMIT ?",
            (KEPT_STARTS,),
        )
        return [
            _Kept(r[0], r[1] or "", r[2] or "", _cold_start(r[3:]))
            for r in reversed(rows)
            if r[5] in _OUTCOMES
        ]

    def _insert(self, entry: _Kept) -> bool:
        target, engine, model, cold = entry
        return self._write(
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
        return [_cold_start(r) for r in rows if r[2] in _OUTCOMES]

    def expectations(self, target: str) -> Expectations:
        """Median phase durations, longest quiet stretches and last peak of good starts."""
        recent = self.starts(target, RECENT_STARTS * 3)
        good = [c for c in recent if c.outcome is StartOutcome.READY][:RECENT_STARTS]
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
            p95_duration_seconds=_p95([c.duration_seconds for c in good]),
            starts=len(good),
        )

    def save_progress(self, saved: SavedStart) -> None:
        """Remember a cold start in progress, or forget it once it finished."""
        if not saved.in_progress:
            self._progress.pop(saved.target, None)
            if saved.target in self._written and self._written[saved.target] is None:
                return
            if self._write("DELETE FROM in_progress WHERE target=?", (saved.target,)):
                self._written[saved.target] = None
            return
        self._progress[saved.target] = saved
        if self._written.get(saved.target) == saved:
            return
        written = self._write(
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
        if written:
            self._written[saved.target] = saved

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


def _p95(values: list[float]) -> float:
    """The 95th percentile; with fewer than 20 values, the largest (no interpolation past)."""
    if len(values) < 20:
        return max(values)
    return statistics.quantiles(values, n=20)[18]


def _lost(
    path: str, known: FileIdentity | None, now: FileIdentity | None, checked: FileIdentity | None
) -> str | None:
    """How the file at ``path`` (``now``) stopped being the one open, if it did.

    Its header is read only when the file changed (size, mtime) since it last read well
    (``checked``): an idle store costs a stat a tick, not an open and a read as well.
    """
    if known is None:
        return None
    if now is None:
        return "deleted"
    if (now.device, now.inode) != (known.device, known.inode):
        return "replaced"
    if now.size < known.size:
        return "truncated"
    # Overwritten in place (same file, no smaller): sqlite would notice only when a page it
    # no longer caches is read, a minute or more later; its header says so at once.
    if now == checked or now.size < len(_SQLITE_MAGIC):
        return None
    if _header(path) not in (_SQLITE_MAGIC, None):
        return "malformed"
    return None


def _header(path: str) -> bytes | None:
    """The first bytes of the file, where sqlite writes its magic string; None unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(len(_SQLITE_MAGIC))
    except OSError:
        return None


#: A row of another outcome was written by no version of ours: it is skipped when read.
_OUTCOMES: Final = frozenset(StartOutcome)


def _cold_start(r: tuple[Any, ...] | list[Any]) -> ColdStart:
    """A ``cold_starts`` row from ``started_at`` on as a record."""
    outcome = StartOutcome(r[2])
    return ColdStart(r[0], r[1], outcome, r[3], _load(r[4]), _load(r[5]), r[6], r[7])


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
