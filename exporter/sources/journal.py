"""Engine logs from the systemd journal: systemd-python's reader, else a followed ``journalctl``.

Both follow one unit from a saved cursor, check the journal files before reading them (a
corrupt file is skipped, a missing journal is absent, not down), and return the same
``LogReading`` as the file source. Plain files, saved positions and the factory that picks a
target's source live in ``exporter.sources.logs``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import struct
import subprocess
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final, cast

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import LogReading, RawLogLine
from exporter.sources import TargetSeen
from exporter.sources.logs import CHUNK_BYTES, LINES_PER_SAMPLE, load_state, save_state

log = logging.getLogger(__name__)

#: Entries ``journalctl`` shows from before the exporter started, when no cursor is saved.
JOURNALCTL_BACKLOG_LINES: Final = 2000
#: How long the look for a unit's first entry may take before ``journalctl`` follows it.
JOURNALCTL_CHECK_SECONDS: Final = 5.0
SYSTEM_JOURNAL_DIRS: Final = ("/var/log/journal", "/run/log/journal")
NO_JOURNAL_HINT: Final = (
    "no systemd journal on this host (/var/log/journal, /run/log/journal): set journal = false "
    "and a log_file in the target, or mount the journal into the exporter's container"
)
_JOURNAL_MAGIC: Final = b"LPKSHHRH"
_QUIET_JSON: Final = ("--output=json", "--no-pager", "--quiet")


@functools.cache
def journal_module() -> ModuleType | None:
    """systemd-python's journal module, or None (the journalctl fallback serves then).

    Imported on first use: its native libraries cost about 2.6 MiB of RSS, which a daemon
    reading only log files should not pay (issue 18).
    """
    try:
        from systemd import journal
    except ImportError:  # pragma: no cover - exercised on hosts without the package
        return None
    return cast(ModuleType, journal)  # untyped C binding


# --- journald -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalFiles:
    """What a look at the journal directories found."""

    readable: tuple[str, ...]
    unreadable: tuple[str, ...]
    corrupt: tuple[str, ...]


def _journal_files(dirs: Iterable[str]) -> Iterable[str]:
    for d in dirs:
        for root, subdirs, files in os.walk(d, onerror=_raise):
            subdirs[:] = [s for s in subdirs if not s.startswith(".")]
            for name in files:
                if name.endswith((".journal", ".journal~")):
                    yield os.path.join(root, name)


def _raise(exc: OSError) -> None:
    raise exc


def _header_ok(path: str) -> bool:
    """A journal file's header is intact and the file is as long as the header says."""
    with open(path, "rb") as fh:
        head = fh.read(104)
        size = os.fstat(fh.fileno()).st_size
    if len(head) < 104 or head[:8] != _JOURNAL_MAGIC:
        return False
    header_size, arena_size = struct.unpack_from("<QQ", head, 88)
    return bool(size >= header_size + arena_size)


def inspect_journal(dirs: Iterable[str]) -> JournalFiles:
    """Check journal files ourselves: python-systemd silently skips unreadable or corrupt ones.

    Raises:
        SourceAbsent: ``missing`` when no directory exists (a host without a journal).
        SourceError: ``permission_denied`` when one cannot be listed.
    """
    existing = [d for d in dirs if os.path.isdir(d)]
    if not existing:
        raise SourceAbsent("missing", "no journal directory", hint=NO_JOURNAL_HINT)
    readable: list[str] = []
    unreadable: list[str] = []
    corrupt: list[str] = []
    try:
        paths = sorted(_journal_files(existing))
    except PermissionError as exc:
        raise SourceError("permission_denied", "journal directory not readable") from exc
    for path in paths:
        try:
            (readable if _header_ok(path) else corrupt).append(path)
        except PermissionError:
            unreadable.append(path)
        except OSError:
            corrupt.append(path)
    return JournalFiles(tuple(readable), tuple(unreadable), tuple(corrupt))


def check_journal(dirs: Iterable[str], seen_corrupt: set[str]) -> JournalFiles:
    """``inspect_journal`` plus the verdict: unreadable system files make the source fail.

    User journals (``user-*.journal``) are skipped: services log to the system journal.
    """
    files = inspect_journal(dirs)
    blocked = [p for p in files.unreadable if not os.path.basename(p).startswith("user-")]
    if blocked:
        raise SourceError("permission_denied", f"{len(blocked)} journal files not readable")
    for path in sorted(set(files.corrupt) - seen_corrupt):
        log.warning("journal file corrupt, skipped path=%s", path)
        seen_corrupt.add(path)
    if files.corrupt and not files.readable:
        raise SourceError("corrupt", "no intact journal file")
    return files


def unit_name(unit: str) -> str:
    """``vllm`` -> ``vllm.service``; names with a unit suffix stay as they are."""
    return unit if "." in unit else f"{unit}.service"


def _message_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):  # journalctl JSON writes non-UTF-8 messages as byte arrays
        return bytes(b & 0xFF for b in value if isinstance(b, int)).decode(
            "utf-8", errors="replace"
        )
    return "" if value is None else str(value)


def _realtime(value: object, fallback: float) -> float:
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return int(str(value)) / 1e6
    except ValueError:
        return fallback


class _JournalFollower:
    """What both journal readers share: unit, cursor and the file checks."""

    name: Final = "logs"

    def __init__(
        self,
        unit: str,
        *,
        cursor_file: str | None,
        since: float | None,
        journal_dir: str | None = None,
        max_lines: int = LINES_PER_SAMPLE,
    ) -> None:
        self.unit = unit_name(unit)
        self.max_lines = max_lines
        self._cursor_file = cursor_file
        self._since = since
        self._journal_dir = journal_dir
        self._dirs = (journal_dir,) if journal_dir else SYSTEM_JOURNAL_DIRS
        saved = load_state(cursor_file)
        cursor = saved.get("cursor") if saved.get("unit") == self.unit else None
        self._cursor: str | None = cursor if isinstance(cursor, str) else None
        self._seen_corrupt: set[str] = set()
        #: Journal files found corrupt (and skipped) at the last check.
        self.corrupt_files: tuple[str, ...] = ()

    def sample(self, deadline: float | None = None, seen: TargetSeen | None = None) -> LogReading:
        """The unit's entries written since the last call (at most ``max_lines``)."""
        self._prepare()
        lines: list[RawLogLine] = []
        last = self._cursor
        while len(lines) < self.max_lines:
            entry = self._next_entry()
            if entry is None:
                break
            at = _realtime(entry.get("__REALTIME_TIMESTAMP"), time.time())
            lines.append(RawLogLine(_message_text(entry.get("MESSAGE")), at))

            last = str(entry.get("__CURSOR", last))
        if last != self._cursor and last is not None:
            self._cursor = last
            save_state(self._cursor_file, {"unit": self.unit, "cursor": last})
        self._finish(got_entries=bool(lines))
        return LogReading(tuple(lines))

    def _check_files(self) -> None:
        self.corrupt_files = check_journal(self._dirs, self._seen_corrupt).corrupt

    def _prepare(self) -> None:
        """Open (or reopen) the journal before reading."""

    def _next_entry(self) -> Mapping[str, object] | None:
        """The next entry of the unit, or None when there is none yet."""
        return None

    def _finish(self, *, got_entries: bool) -> None:
        """Called after each read."""


class JournalLogSource(_JournalFollower):
    """Follows one systemd unit's journal entries through systemd-python.

    Starts at the saved cursor, else at ``since``, else at the first entry of the unit's
    latest invocation; saves the cursor after every read so an exporter restart counts
    nothing twice. Rotation is followed through the reader's inotify descriptor.
    """

    #: The systemd-python reader, opened on the first ``sample()`` (an untyped C binding).
    _reader: Any = None
    #: ``systemd.journal``, set when the reader is opened (untyped too).
    _module: Any = None
    #: An entry read ahead of its turn, returned by the next ``_next_entry()``.
    _stash: Mapping[str, object] | None = None

    def close(self) -> None:
        """Close the journal reader."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _prepare(self) -> None:
        if self._reader is None:
            self._open()
        elif self._reader.process() == self._module.INVALIDATE:
            self._check_files()  # files were added or removed: rotation or vacuum

    def _next_entry(self) -> Mapping[str, object] | None:
        if self._stash is not None:
            entry, self._stash = self._stash, None
            return entry
        try:
            got: Mapping[str, object] | None = self._reader.get_next()
        except OSError as exc:
            self.close()
            raise SourceError("read_error", exc.strerror or "journal read failed") from exc
        return got or None

    def _open(self) -> None:
        journal = journal_module()
        if journal is None:
            raise SourceError("unsupported", "systemd-python is not installed")
        self._module = journal
        self._check_files()
        try:
            if self._journal_dir:
                reader = journal.Reader(path=self._journal_dir)
            else:
                reader = journal.Reader(flags=journal.SYSTEM)
            reader.fileno()  # sets up inotify, without which rotation goes unnoticed
        except OSError as exc:
            raise SourceError("read_error", exc.strerror or "journal open failed") from exc
        self._reader = reader
        self._seek_start()
        log.info("journal opened unit=%s from=%s", self.unit, self._start_label())

    def _match_unit(self) -> None:
        self._reader.flush_matches()
        self._reader.add_match(_SYSTEMD_UNIT=self.unit)
        self._reader.add_disjunction()
        self._reader.add_match(UNIT=self.unit, _PID="1")  # systemd's own lines (oom-kill)

    def _seek_start(self) -> None:
        r = self._reader
        self._match_unit()
        if self._cursor:
            r.seek_cursor(self._cursor)
            entry = r.get_next()
            if entry and not r.test_cursor(self._cursor):
                self._stash = entry  # the saved entry was vacuumed: resume at the next one
        elif self._since is not None:
            r.seek_realtime(self._since)
        else:
            self._seek_invocation()

    def _seek_invocation(self) -> None:
        """Position before the first entry of the unit's latest invocation (else the tail)."""
        r = self._reader
        r.seek_tail()
        last = r.get_previous()
        if not last:
            # Nothing logged yet: from the head, so the first burst is read whole. Left at
            # the tail, the next read would jump to the burst's last entry (sd_journal_next
            # after a tail seek with no entry before it).
            r.seek_head()
            return
        # The unit's own lines carry _SYSTEMD_INVOCATION_ID; systemd's lines about it
        # ("Failed with result 'oom-kill'") carry INVOCATION_ID.
        invocation = last.get("_SYSTEMD_INVOCATION_ID") or last.get("INVOCATION_ID")
        if not invocation:
            return  # no invocation id: follow the entries after the last one
        r.flush_matches()
        r.add_match(_SYSTEMD_INVOCATION_ID=str(invocation))
        r.add_disjunction()
        r.add_match(INVOCATION_ID=str(invocation), UNIT=self.unit)
        r.seek_head()
        first = r.get_next()
        self._match_unit()
        if first:
            r.seek_realtime(first["__REALTIME_TIMESTAMP"])

    def _start_label(self) -> str:
        if self._cursor:
            return "cursor"
        return "since" if self._since is not None else "invocation"


class JournalctlLogSource(_JournalFollower):
    """The same as ``JournalLogSource`` through ``journalctl --follow --output=json``.

    For hosts without systemd-python. The child is read without blocking and restarted
    from the saved cursor when it exits.
    """

    def __init__(
        self,
        unit: str,
        *,
        cursor_file: str | None,
        since: float | None,
        journal_dir: str | None = None,
        journalctl: str = "journalctl",
        max_lines: int = LINES_PER_SAMPLE,
    ) -> None:
        super().__init__(
            unit, cursor_file=cursor_file, since=since, journal_dir=journal_dir, max_lines=max_lines
        )
        self._journalctl = journalctl
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._records: deque[dict[str, Any]] = deque()

    def close(self) -> None:
        """Stop the journalctl child and close its pipes."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    def _command(self) -> list[str]:
        cmd = [self._journalctl, "--follow", "--output=json", "--no-pager", "--all"]
        cmd += self._selection()
        if self._cursor:
            cmd += ["--after-cursor", self._cursor]
        elif self._since is not None:
            cmd += ["--since", f"@{self._since:.6f}", "--lines=all"]
        elif self._logged_before():
            cmd += [f"--lines={JOURNALCTL_BACKLOG_LINES}"]
        else:
            # Nothing logged yet: from the head. Followed from the tail of nothing,
            # journalctl shows only the last entry of the first burst written.
            cmd += ["--lines=all"]
        return cmd

    def _selection(self) -> list[str]:
        where = ["--directory", self._journal_dir] if self._journal_dir else []
        return ["--unit", self.unit, *where]

    def _logged_before(self) -> bool:
        """The unit has an entry already (True when journalctl cannot tell)."""
        try:
            out = subprocess.run(
                [self._journalctl, *self._selection(), "--lines=1", *_QUIET_JSON],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=JOURNALCTL_CHECK_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return True
        return out.returncode != 0 or bool(out.stdout.strip())

    def _prepare(self) -> None:
        if self._proc is not None:
            return
        self._check_files()
        try:
            proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise SourceError("unsupported", "journalctl cannot be run") from exc
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._proc, self._pending = proc, b""
        self._records.clear()

    def _next_entry(self) -> Mapping[str, object] | None:
        if not self._records:
            self._records.extend(self._read_records())
        return self._records.popleft() if self._records else None

    def _read_records(self) -> list[dict[str, Any]]:
        """The JSON records in what the child wrote since the last call."""
        assert self._proc is not None and self._proc.stdout is not None
        try:
            chunk = self._proc.stdout.read(CHUNK_BYTES)
        except BlockingIOError:
            return []
        *lines, self._pending = (self._pending + (chunk or b"")).split(b"\n")
        records = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
        return records

    def _finish(self, *, got_entries: bool) -> None:
        if got_entries or self._proc is None or self._proc.poll() is None:
            return
        assert self._proc.stderr is not None
        stderr = self._proc.stderr.read().decode("utf-8", errors="replace").strip()
        self.close()
        if "permission" in stderr.lower():
            raise SourceError("permission_denied", "journalctl: insufficient permissions")
        if "no journal files" in stderr.lower():
            raise SourceError("missing", "journalctl found no journal files")
        raise SourceError("journalctl_exited", stderr.splitlines()[-1][:200] if stderr else "")
