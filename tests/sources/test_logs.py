"""Log sources against real files and real journal files written by systemd-journal-remote.

Journal files are made the way a remote journal receives them: the test writes the journal
export format and ``/lib/systemd/systemd-journal-remote -o DIR/x.journal -`` turns it into a
real journal file that systemd-python (and journalctl) then read.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from exporter.base.errors import SourceAbsent, SourceError
from exporter.base.model import FailureReason, LogClass, LogEvent
from exporter.config import Target
from exporter.core.classify import MAX_LINE_CHARS, LogClassifier
from exporter.core.lifecycle import initial_state
from exporter.core.logblock import reading_lines
from exporter.core.observe import TargetWorld, classify_lines, read_log
from exporter.engines import ENGINES
from exporter.sources.journal import JournalctlLogSource, JournalLogSource
from exporter.sources.logs import FileLogSource, make_log_source

REPO_ROOT = Path(__file__).resolve().parents[2]
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
UNIT = "vllm.service"
INVOCATION_OLD = "0" * 31 + "1"
INVOCATION_NEW = "0" * 31 + "2"
BOOT = "00112233445566778899aabbccddeeff"
CANARY = "sk-CANARYsecret123"


class Classified:
    """A log source read as the daemon reads it: its raw lines, then the observe stage."""

    def __init__(self, source, engine: str = "vllm") -> None:
        self.source = source
        self.world = TargetWorld(initial_state("t"), LogClassifier(ENGINES[engine].log))

    def read(self, max_lines: int = 5000) -> tuple[LogEvent, ...]:
        self.source.max_lines = max_lines
        return classify_lines(self.world, None, self.source.sample())

    def close(self) -> None:
        self.source.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def texts(events: Sequence[LogEvent]) -> list[str]:
    return [e.text for e in events]


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """Register sources to be closed at the end of the test."""
    sources: list[Any] = []

    def register(source):
        sources.append(source)
        return source

    yield register
    for source in sources:
        source.close()


# --- plain files ----------------------------------------------------------------------------


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_appended_lines_are_read_once_and_a_partial_line_waits(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO 05-12 02:45:10 one\nINFO 05-12 02:45:11 tw")
    src = closing(Classified(FileLogSource(str(log))))
    assert texts(src.read()) == ["INFO 05-12 02:45:10 one"]
    assert src.read() == ()
    append(log, b"o\nINFO 05-12 02:45:12 three\n")
    events = src.read()
    assert texts(events) == ["INFO 05-12 02:45:11 two", "INFO 05-12 02:45:12 three"]
    assert [e.line_no for e in events] == [2, 3]


def test_progress_redraws_arrive_before_the_bar_ends_its_line(tmp_path, closing):
    # A tqdm bar writes "\r" updates and a single "\n" at the very end.
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    src = closing(Classified(FileLogSource(str(log))))
    seen = []
    for i in range(4):
        append(
            log, f"\rLoading safetensors checkpoint shards: {i * 25}% Completed | {i}/4 [".encode()
        )
        append(log, b"00:01<00:02]")
        seen += [e.progress for e in src.read()]
    append(log, b"\r\nINFO 05-12 02:45:35 [loader.py:458] Loading weights took 3.83 seconds\n")
    tail = src.read()
    assert seen == [(0, 4), (1, 4), (2, 4)]  # each update as soon as the next one began
    assert tail[0].progress == (3, 4)
    assert tail[-1].marker == "weights_end"


def test_cr_joined_bars_in_one_line_each_become_an_update(tmp_path, closing):
    log = tmp_path / "engine.log"
    bars = "".join(
        f"\rCapturing batches (bs={64 - i} avail_mem=6.7 GB): {i * 10}%|###| {i}/10 [00:0{i}<00:01]"
        for i in range(11)
    )
    log.write_bytes(bars.encode() + b"\n[2026-08-01 23:43:42] max_total_num_tokens=185897\n")
    events = closing(Classified(FileLogSource(str(log)), "sglang")).read()
    assert [e.progress for e in events if e.progress] == [(i, 10) for i in range(11)]
    assert {e.progress_key for e in events if e.progress} == {"cuda_graph"}
    assert events[-1].marker == "scheduler_ready"
    assert {e.line_no for e in events} == {1, 2}


def test_ansi_colour_codes_are_stripped_before_matching(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(
        b"\x1b[1;36m(APIServer pid=4394)\x1b[0;0m INFO:     Application startup complete.\n"
        b"#033[2m2024-04-18T22:43:58Z#033[0m #033[32m INFO#033[0m Starting Webserver\n"
    )
    events = closing(Classified(FileLogSource(str(log)))).read()
    assert events[0].text == "(APIServer pid=4394) INFO:     Application startup complete."
    assert events[0].marker == "ready"
    assert "#033" not in events[1].text and "\x1b" not in events[0].text


def test_a_megabyte_line_is_capped_and_the_next_line_is_intact(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO 05-12 02:45:15 args: " + b"x" * 600_000)
    src = closing(Classified(FileLogSource(str(log))))
    assert src.read() == ()  # still no end of line: nothing to say yet
    append(log, b"y" * 600_000 + b"\nINFO 05-12 02:45:31 Starting to load model /m...\n")
    events = src.read()
    assert len(events) == 2
    assert len(events[0].text) <= MAX_LINE_CHARS and events[0].text.endswith("x")
    assert events[1].marker == "weights_begin"


def test_binary_garbage_is_survived(tmp_path, closing):
    log = tmp_path / "engine.log"
    noise = bytes((i * 7919 + 13) % 256 for i in range(200_000))
    log.write_bytes(
        noise + b"\n\xff\xfe\x00bad utf-8 \xc3\x28\nINFO 05-12 02:45:31 Starting to load model\n"
    )
    events = closing(Classified(FileLogSource(str(log)))).read()
    assert events[-1].marker == "weights_begin"
    for e in events:
        assert isinstance(e.text, str)
        assert not any(ord(ch) < 32 and ch != "\t" for ch in e.text)
    assert any("\ufffd" in e.text and "bad utf-8" in e.text for e in events)


def test_rotation_drains_the_old_file_then_follows_the_new_one(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO 05-12 02:45:10 old 1\n")
    src = closing(Classified(FileLogSource(str(log))))
    assert texts(src.read()) == ["INFO 05-12 02:45:10 old 1"]
    append(log, b"INFO 05-12 02:45:11 old 2\n")  # written just before logrotate's rename
    log.rename(tmp_path / "engine.log.1")
    log.write_bytes(b"INFO 05-12 02:45:12 new 1\nINFO 05-12 02:45:13 new 2\n")
    got = texts(src.read()) + texts(src.read()) + texts(src.read())
    assert got == [
        "INFO 05-12 02:45:11 old 2",
        "INFO 05-12 02:45:12 new 1",
        "INFO 05-12 02:45:13 new 2",
    ]


def test_truncation_in_place_starts_over(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO 05-12 02:45:10 a long first line before copytruncate\n" * 3)
    src = closing(Classified(FileLogSource(str(log))))
    assert len(src.read()) == 3
    with open(log, "r+b") as fh:  # copytruncate: same inode, emptied, then written again
        fh.truncate(0)
    append(log, b"INFO 05-12 02:46:00 after\n")
    events = src.read()
    assert texts(events) == ["INFO 05-12 02:46:00 after"]
    assert events[0].line_no == 1


def test_a_missing_file_is_absent_until_it_appears(tmp_path, closing):
    log = tmp_path / "engine.log"
    src = closing(Classified(FileLogSource(str(log))))
    with pytest.raises(SourceAbsent) as err:  # not written yet: no data, not a failure
        src.read()
    assert err.value.reason == "missing" and "log_file" in err.value.hint
    log.write_bytes(b"INFO 05-12 02:45:10 hello\n")
    assert texts(src.read()) == ["INFO 05-12 02:45:10 hello"]


def test_start_at_end_skips_what_is_already_there(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO 05-12 02:45:10 old\n")
    src = closing(Classified(FileLogSource(str(log), start_at_end=True)))
    assert src.read() == ()
    append(log, b"INFO 05-12 02:45:11 new\n")
    assert texts(src.read()) == ["INFO 05-12 02:45:11 new"]


def test_a_restart_resumes_at_the_saved_offset(tmp_path, closing):
    log, pos = tmp_path / "engine.log", str(tmp_path / "engine.pos")
    log.write_bytes(b"INFO 05-12 02:45:10 one\nINFO 05-12 02:45:11 tw")
    first = Classified(FileLogSource(str(log), offset_file=pos))
    assert texts(first.read()) == ["INFO 05-12 02:45:10 one"]
    first.close()
    append(log, b"o\n")
    second = closing(Classified(FileLogSource(str(log), offset_file=pos)))
    assert texts(second.read()) == ["INFO 05-12 02:45:11 two"]


def test_max_lines_bounds_a_read_without_losing_lines(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(b"".join(b"INFO 05-12 02:45:10 line %d\n" % i for i in range(100)))
    src = closing(Classified(FileLogSource(str(log))))
    batches = [src.read(max_lines=30) for _ in range(4)]
    assert [len(b) for b in batches] == [30, 30, 30, 10]
    got = [e.text for b in batches for e in b]
    assert got == [f"INFO 05-12 02:45:10 line {i}" for i in range(100)]


def test_secrets_in_a_log_file_do_not_come_out(tmp_path, closing):
    log = tmp_path / "engine.log"
    log.write_bytes(f"INFO 08-01 18:02:54 non-default args: {{'api_key': '{CANARY}'}}\n".encode())
    (event,) = closing(Classified(FileLogSource(str(log)))).read()
    assert "CANARY" not in event.text


WRITER = r"""
import sys, time
path = sys.argv[1]
with open(path, "ab", buffering=0) as fh:
    fh.write(b"[2026-08-01 23:37:50] Load weight begin. avail mem=115.36 GB\n")
    for i in range(16):
        bar = b"Multi-thread loading shards: %3d%% Completed | %d/15 [00:%02d<00:10]"
        fh.write(b"\r" + bar % (i * 100 // 15, i, i))
        time.sleep(0.01)
    fh.write(b"\n[2026-08-01 23:39:39] Load weight end. elapsed=109.33 s\n")
"""


@pytest.mark.integration
def test_a_real_writer_process_is_followed_live(tmp_path, closing):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"")
    src = closing(Classified(FileLogSource(str(log)), "sglang"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)])
    events: list[LogEvent] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(e.marker == "weights_end" for e in events):
        events += src.read()
        time.sleep(0.005)
    assert writer.wait(timeout=30) == 0
    progress = [e.progress for e in events if e.progress]
    assert progress == [(i, 15) for i in range(16)]
    assert [e.marker for e in events if e.marker != "shards"] == ["weights_begin", "weights_end"]


# --- unreadable files, as another user ------------------------------------------------------

CHILD = r"""
import os, pwd, sys
from exporter.base.errors import SourceAbsent, SourceError
from exporter.core.logblock import reading_lines
from exporter.sources.journal import JournalLogSource
from exporter.sources.logs import FileLogSource
import systemd.journal  # imported on first use by the source: here before dropping root
kind, path, drop = sys.argv[1], sys.argv[2], sys.argv[3] == "drop"
if drop:  # the interpreter lives under /root: import as root first, then become nobody
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
if kind == "file":
    src = FileLogSource(path)
else:
    src = JournalLogSource("vllm", cursor_file=None, since=None, journal_dir=path)
try:
    print("read %d" % len(reading_lines(src.sample())))
except SourceError as exc:
    print(exc.reason)
finally:
    src.close()
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user may enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="ile-logs-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def read_as_another_user(kind: str, path: Path) -> str:
    """What a reader without access gets: as root, a child that drops to nobody; as anyone
    else, a child after ``chmod 000``.
    """
    root = os.geteuid() == 0
    if not root:
        for p in [path] if kind == "file" else list(path.glob("*.journal")):
            p.chmod(0)
    cmd = [sys.executable, "-c", CHILD, kind, str(path), "drop" if root else "stay"]
    out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.integration
def test_an_unreadable_log_file_is_permission_denied(shared_dir):
    log = shared_dir / "engine.log"
    log.write_bytes(b"INFO 05-12 02:45:10 private\n")
    log.chmod(0o600)
    assert read_as_another_user("file", log) == "permission_denied"


# --- journald -------------------------------------------------------------------------------


def export_entry(
    message: str | bytes,
    usec: int,
    *,
    unit: str = UNIT,
    invocation: str = INVOCATION_NEW,
    fields: dict[str, str] | None = None,
) -> bytes:
    """One entry in the journal export format (binary-safe MESSAGE)."""
    head = {
        "__REALTIME_TIMESTAMP": str(usec),
        "__MONOTONIC_TIMESTAMP": str(usec % 10**9),
        "_BOOT_ID": BOOT,
        "_HOSTNAME": "gpu-host",
        "_SYSTEMD_UNIT": unit,
        "_SYSTEMD_INVOCATION_ID": invocation,
        "PRIORITY": "6",
        **(fields or {}),
    }
    body = b"".join(f"{k}={v}\n".encode() for k, v in head.items() if v)
    data = message.encode() if isinstance(message, str) else message
    return body + b"MESSAGE\n" + struct.pack("<Q", len(data)) + data + b"\n\n"


class Journal:
    """A journal directory the test writes entries into, as a remote journal would."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.usec = int((time.time() - 3600) * 1e6)

    def write(self, *messages: str | bytes, name: str = "system.journal", **kw) -> None:
        entries = []
        for m in messages:
            self.usec += 1000
            entries.append(export_entry(m, self.usec, **kw))
        out = subprocess.run(
            [JOURNAL_REMOTE, "-o", str(self.dir / name), "-"],
            input=b"".join(entries),
            capture_output=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr.decode()

    def rotate(self) -> None:
        archived = f"system@{'a' * 32}-{self.usec:016x}-{self.usec:016x}.journal"
        (self.dir / "system.journal").rename(self.dir / archived)

    def source(self, cls=JournalLogSource, *, cursor: Path | None = None, since=None, **kw):
        return Classified(
            cls(
                "vllm",
                cursor_file=str(cursor) if cursor else None,
                since=since,
                journal_dir=str(self.dir),
                **kw,
            )
        )


@pytest.fixture
def journal(tmp_path) -> Journal:
    (tmp_path / "journal").mkdir()
    return Journal(tmp_path / "journal")


def read_until(source, count: int, timeout: float = 20.0) -> list[LogEvent]:
    """Read until ``count`` events arrived (journalctl delivers asynchronously)."""
    events: list[LogEvent] = []
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        events += source.read()
        if len(events) < count:
            time.sleep(0.05)
    return events


@pytest.mark.integration
def test_journal_entries_of_the_unit_are_classified(journal, closing):
    journal.write("INFO 10-14 19:22:48 [gpu_model_runner.py:2602] Starting to load model m...")
    written_at = journal.usec / 1e6
    journal.write("another unit's line", unit="sshd.service")
    journal.write(
        b"\rLoading safetensors checkpoint shards: 50% Completed | 2/4 [00:02<00:02]"
        b"\rLoading safetensors checkpoint shards: 100% Completed | 4/4 [00:04<00:00]",
        b"non-UTF-8 \xff\xfe line",
    )
    events = closing(journal.source()).read()
    assert events[0].marker == "weights_begin"
    assert [e.progress for e in events[1:3]] == [(2, 4), (4, 4)]
    assert "\ufffd" in events[3].text
    assert "another unit's line" not in texts(events)
    # journald's timestamp, not the one printed in the line.
    assert events[0].at == pytest.approx(written_at, abs=1e-3)


@pytest.mark.integration
def test_systemds_own_oom_kill_line_about_the_unit_is_fatal(journal, closing):
    journal.write("Starting to load model /m...")
    journal.write(
        f"{UNIT}: A process of this unit has been killed by the OOM killer.",
        f"{UNIT}: Failed with result 'oom-kill'.",
        unit="init.scope",
        fields={"UNIT": UNIT, "_PID": "1"},
    )
    events = closing(journal.source()).read()
    assert events[-1].cls is LogClass.FATAL
    assert events[-1].fatal_reason is FailureReason.OOM


@pytest.mark.integration
def test_live_appends_and_a_rotation_are_each_read_once(journal, closing):
    journal.write("INFO 05-12 02:45:10 one", "INFO 05-12 02:45:11 two")
    src = closing(journal.source())
    assert len(src.read()) == 2
    assert src.read() == ()
    journal.write("INFO 05-12 02:45:12 three")  # appended to the open file
    assert texts(src.read()) == ["INFO 05-12 02:45:12 three"]
    journal.rotate()
    journal.write("INFO 05-12 02:45:13 four", "INFO 05-12 02:45:14 five")
    assert texts(src.read()) == ["INFO 05-12 02:45:13 four", "INFO 05-12 02:45:14 five"]
    assert src.read() == ()


@pytest.mark.integration
def test_the_saved_cursor_makes_a_restart_count_nothing_twice(journal, tmp_path, closing):
    cursor = tmp_path / "cursor.json"
    journal.write("INFO 05-12 02:45:10 one", "INFO 05-12 02:45:11 two")
    first = journal.source(cursor=cursor)
    assert len(first.read()) == 2
    first.close()
    journal.write("INFO 05-12 02:45:12 three")
    journal.rotate()
    journal.write("INFO 05-12 02:45:13 four")
    second = closing(journal.source(cursor=cursor))
    assert texts(second.read()) == ["INFO 05-12 02:45:12 three", "INFO 05-12 02:45:13 four"]


@pytest.mark.integration
def test_without_a_cursor_reading_starts_at_the_latest_invocation(journal, closing):
    journal.write("INFO 05-12 01:00:00 previous run: CUDA out of memory", invocation=INVOCATION_OLD)
    journal.write("INFO 05-12 02:45:10 this run begins", "INFO 05-12 02:45:11 and goes on")
    events = closing(journal.source()).read()
    assert texts(events) == [
        "INFO 05-12 02:45:10 this run begins",
        "INFO 05-12 02:45:11 and goes on",
    ]


@pytest.mark.integration
def test_a_failed_run_ending_in_systemds_own_line_is_read_from_its_start(journal, closing):
    journal.write("INFO 05-12 01:00:00 an earlier run", invocation=INVOCATION_OLD)
    journal.write("INFO 05-12 02:45:10 Starting to load model /m...")
    journal.write(
        f"{UNIT}: Failed with result 'oom-kill'.",
        unit="init.scope",
        invocation="",
        fields={"UNIT": UNIT, "_PID": "1", "INVOCATION_ID": INVOCATION_NEW},
    )
    events = closing(journal.source()).read()
    assert [e.marker for e in events] == ["weights_begin", None]
    assert events[-1].fatal_reason is FailureReason.OOM


@pytest.mark.integration
def test_since_skips_older_entries(journal, closing):
    journal.write("INFO 05-12 02:45:10 before")
    since = (journal.usec + 500) / 1e6
    journal.write("INFO 05-12 02:45:11 after")
    assert texts(closing(journal.source(since=since)).read()) == ["INFO 05-12 02:45:11 after"]


@pytest.mark.integration
def test_secrets_in_the_journal_do_not_come_out(journal, closing):
    journal.write(f"vllm serve m --api-key {CANARY} --port 8000")
    (event,) = closing(journal.source()).read()
    assert "CANARY" not in event.text


@pytest.mark.integration
def test_corrupt_journal_files_beside_good_ones_are_skipped_and_counted(journal, closing):
    journal.write("INFO 05-12 02:45:10 good")
    good = (journal.dir / "system.journal").read_bytes()
    (journal.dir / "garbage.journal").write_bytes(bytes(range(256)) * 64)
    (journal.dir / f"system@{'b' * 32}-1-1.journal").write_bytes(good[:3000])
    src = closing(journal.source())
    assert texts(src.read()) == ["INFO 05-12 02:45:10 good"]
    assert sorted(Path(p).name for p in src.corrupt_files) == [
        "garbage.journal",
        f"system@{'b' * 32}-1-1.journal",
    ]


def test_only_corrupt_journal_files_are_a_source_error(journal, closing):
    (journal.dir / "system.journal").write_bytes(bytes(range(256)) * 16)
    with pytest.raises(SourceError) as err:
        closing(journal.source()).read()
    assert err.value.reason == "corrupt"


def test_a_host_without_a_journal_reads_as_absent_with_the_keys_to_use(tmp_path, closing):
    src = closing(Journal(tmp_path / "nowhere").source())
    with pytest.raises(SourceAbsent) as err:
        src.read()
    assert err.value.reason == "missing"
    assert "journal = false" in err.value.hint and "log_file" in err.value.hint


@pytest.mark.integration
def test_an_unreadable_journal_is_permission_denied_not_silence(shared_dir):
    # python-systemd would return no entries at all (RELIABILITY finding 6, case E51).
    Journal(shared_dir).write("INFO 05-12 02:45:10 private")
    (shared_dir / "system.journal").chmod(0o640)
    assert read_as_another_user("journal", shared_dir) == "permission_denied"


# --- the journalctl fallback ----------------------------------------------------------------


@pytest.mark.integration
def test_journalctl_follows_appends_and_resumes_from_its_cursor(journal, tmp_path, closing):
    cursor = tmp_path / "cursor.json"
    journal.write("INFO 10-14 19:22:48 Starting to load model m...", f"--api-key={CANARY}")
    first = journal.source(JournalctlLogSource, cursor=cursor)
    events = read_until(first, 2)
    assert events[0].marker == "weights_begin"
    assert "CANARY" not in events[1].text
    journal.write("INFO 05-12 02:45:12 three")
    assert texts(read_until(first, 1)) == ["INFO 05-12 02:45:12 three"]
    first.close()
    journal.write("INFO 05-12 02:45:13 four")
    second = closing(journal.source(JournalctlLogSource, cursor=cursor))
    assert texts(read_until(second, 1)) == ["INFO 05-12 02:45:13 four"]
    time.sleep(0.2)
    assert second.read() == ()


@pytest.mark.integration
def test_journalctl_that_cannot_run_is_a_source_error(journal, closing):
    journal.write("INFO 05-12 02:45:10 one")
    src = closing(journal.source(JournalctlLogSource, journalctl="/nonexistent/journalctl"))
    with pytest.raises(SourceError) as err:
        src.read()
    assert err.value.reason == "unsupported"


# --- the factory ----------------------------------------------------------------------------


def target(**kw) -> Target:
    return Target(
        name="llm",
        engine="vllm",
        base_url="http://127.0.0.1:8000",
        health_path="/health",
        probe_timeout_seconds=1.0,
        **kw,
    )


def test_the_factory_builds_what_the_config_names(tmp_path):
    src = make_log_source(target(log_file=str(tmp_path / "x.log")), str(tmp_path))
    assert isinstance(src, FileLogSource)
    src = make_log_source(target(unit="vllm", journal=True), str(tmp_path))
    assert isinstance(src, JournalLogSource) and src.unit == UNIT
    assert make_log_source(target(unit="vllm"), str(tmp_path)) is None


def test_a_read_that_cannot_finish_reports_its_backlog_and_since_when(tmp_path):
    log = tmp_path / "engine.log"
    log.write_bytes(b"".join(b"INFO 05-12 02:45:10 line %d\n" % i for i in range(5000)))
    clock = iter([100.0, 101.0, 102.0]).__next__
    src = FileLogSource(str(log), max_lines=1000, clock=clock)
    first, second = src.sample(), src.sample()
    assert first.backlog_bytes > second.backlog_bytes > 0
    assert first.behind_since == second.behind_since == 100.0
    src.max_lines = 10_000
    last = src.sample()
    assert (last.backlog_bytes, last.behind_since) == (0, None)
    src.close()


def test_a_flood_reaches_the_core_whole_its_fatal_line_classified_and_every_line_counted(
    tmp_path,
):
    log = tmp_path / "engine.log"
    noise = b"INFO 05-12 02:45:10 [metrics.py:455] GPU KV cache usage: 0.0%\n" * 20_000
    fatal = b"ERROR 05-12 02:45:11 torch.OutOfMemoryError: CUDA out of memory\n"
    log.write_bytes(noise + fatal + noise)
    src = FileLogSource(str(log), start_at_end=False)
    lines = src.sample()
    assert len(reading_lines(lines)) == 40_001  # the source drops nothing: one screen, in the core
    world = TargetWorld(initial_state("t"), LogClassifier(ENGINES["vllm"].log))
    events, tally = read_log(world, None, lines)
    assert [(e.line_no, e.fatal_reason) for e in events] == [(20_001, FailureReason.OOM)]
    assert dict(tally.counts) == {LogClass.INFO: 40_000}  # counted, never made events
    src.close()
