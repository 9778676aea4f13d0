"""The sqlite history: survives restarts, and a bad store never stops the daemon."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import time

import pytest

from exporter.base.model import Phase
from exporter.base.records import ColdStart, SavedStart, StartOutcome
from exporter.config import Settings
from exporter.core.lifecycle import learned_stall_seconds
from exporter.daemon import Daemon
from exporter.history import LOSS_VISIBLE_SECONDS, History


def cold(start, outcome="ready", loading=300.0, quiet=40.0):
    return ColdStart(
        start,
        start + 60 + loading,
        StartOutcome(outcome),
        None if outcome == "ready" else "oom",
        ((Phase.STARTING, 60.0), (Phase.LOADING, loading)),
        ((Phase.LOADING, quiet),),
        10,
        76 * 2**30,
    )


def test_outcomes_are_stored_and_read_as_the_same_strings(tmp_path):
    store = History.open(str(tmp_path))
    store.record("t", "sglang", "m", cold(1000.0, outcome="failed"))
    store.record("t", "sglang", "m", cold(3000.0))
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        stored = [r[0] for r in db.execute("SELECT outcome FROM cold_starts ORDER BY started_at")]
    assert stored == ["failed", "ready"]
    assert [c.outcome for c in store.starts("t")] == [StartOutcome.READY, StartOutcome.FAILED]


def test_expectations_come_from_recent_successful_starts(tmp_path):
    store = History.open(str(tmp_path))
    for i, loading in enumerate([300.0, 500.0, 400.0]):
        store.record("t", "sglang", "m", cold(1000.0 * i, loading=loading, quiet=30.0 + i))
    store.record("t", "sglang", "m", cold(5000.0, outcome="failed", loading=9999.0, quiet=999))
    exp = store.expectations("t")
    assert exp.starts == 3
    assert exp.phase_seconds[Phase.LOADING] == 400.0  # median of the good ones
    assert exp.longest_quiet[Phase.LOADING] == 32.0  # the failed start does not teach
    assert exp.peak_gpu_bytes == 76 * 2**30
    assert learned_stall_seconds(exp.longest_quiet[Phase.LOADING], None, Phase.LOADING) == 64.0
    store.close()
    reopened = History.open(str(tmp_path))
    assert len(reopened.starts("t")) == 4
    reopened.close()


def test_garbage_file_is_set_aside_with_one_log_line(tmp_path, caplog):
    (tmp_path / "history.sqlite").write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.ERROR):
        store = History.open(str(tmp_path))
    assert not store.in_memory
    assert [r.message for r in caplog.records if "set aside" in r.message]
    assert list(tmp_path.glob("history.sqlite.corrupt-*"))
    store.record("t", "e", "m", cold(1.0))
    assert len(store.starts("t")) == 1
    store.close()


def test_truncated_database_is_set_aside(tmp_path):
    store = History.open(str(tmp_path))
    for i in range(50):
        store.record("t", "e", "m", cold(float(i)))
    store.close()
    path = tmp_path / "history.sqlite"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3] + b"\0garbage")
    for extra in tmp_path.glob("history.sqlite-*"):
        extra.unlink()
    store = History.open(str(tmp_path))
    store.record("t", "e", "m", cold(1.0))
    assert store.starts("t")  # usable again, whatever survived
    store.close()


def test_newer_schema_is_set_aside_not_overwritten(tmp_path):
    path = tmp_path / "history.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.commit()
    conn.close()
    store = History.open(str(tmp_path))
    assert list(tmp_path.glob("history.sqlite.corrupt-*")), "the newer file is kept aside"
    store.close()


def test_unwritable_state_directory_keeps_history_in_memory(tmp_path):
    # root ignores directory modes, so ask for a directory under a regular file instead
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = History.open(str(blocker / "state"))
    assert store.in_memory and store.errors == 1
    store.record("t", "e", "m", cold(1.0))
    assert len(store.starts("t")) == 1  # still works, in memory
    store.close()


@pytest.mark.integration
def test_full_state_directory_stays_reported_until_a_write_works_again(tmp_path):
    mount = _tiny_disk(tmp_path)
    store = History.open(str(mount))
    try:
        _fill(mount / "filler")
        for i in range(200):  # enough rows to need new pages
            store.record("t", "e", "m" * 200, cold(float(i)))
            if store.errors >= 3:
                break  # a few starts left unwritten, as many as the freed room will take
        assert store.errors > 0
        assert store.starts("t") is not None  # reads still answer; the daemon keeps going
        for _ in range(3):  # down on every tick, not one per failure, until it is fixed
            assert store.check() == "write_failed"
        os.unlink(mount / "filler")
        assert store.check() is None
    finally:
        store.close()
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _tiny_disk(tmp_path):
    """A 1 MiB tmpfs (unmounted by the test), where a filler file makes the disk full."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, f"tmpfs mount needs root: {done.stderr!r}"
    return mount


def _fill(path):
    try:
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
    except OSError:
        pass  # the disk is full now


# --- a store lost while the daemon runs -----------------------------------------------------


def _saved(target="t"):
    return SavedStart(target, 4242, 1000.0, Phase.LOADING, 1010.0, ((Phase.STARTING, 10.0),), 0.4)


def _running_store(tmp_path):
    state = tmp_path / "state"
    store = History.open(str(state))
    store.record("t", "e", "m", cold(100.0))
    store.save_progress(_saved())
    assert store.check() is None
    return state, store


def _reopened(state):
    again = History.open(str(state))
    try:
        return [c.started_at for c in again.starts("t", 100)], again.saved_start("t")
    finally:
        again.close()


def test_deleting_the_state_directory_is_reported_and_what_is_in_memory_written_again(tmp_path):
    state, store = _running_store(tmp_path)
    try:
        shutil.rmtree(state)  # writes would now go to unlinked files
        assert store.check() == "lost_deleted"
        store.record("t", "e", "m", cold(200.0))
        assert store.check(time.monotonic() + 60) == "lost_deleted"  # still down a minute on
        assert store.check(time.monotonic() + LOSS_VISIBLE_SECONDS + 1) is None
    finally:
        store.close()
    starts, saved = _reopened(state)
    assert starts == [200.0, 100.0]  # the start recorded before the loss came back
    assert saved is not None and saved.pid == 4242


def test_a_truncated_store_is_set_aside_and_replaced(tmp_path):
    state, store = _running_store(tmp_path)
    try:
        with open(state / "history.sqlite", "r+b") as f:
            f.truncate(1000)
        assert store.check() == "lost_truncated"
        assert list(state.glob("history.sqlite.corrupt-*"))
    finally:
        store.close()
    starts, _ = _reopened(state)
    assert starts == [100.0]


def test_a_store_that_turns_malformed_while_open_is_set_aside(tmp_path):
    state, store = _running_store(tmp_path)
    try:
        for i in range(50):  # enough pages that a read misses the cache
            store.record("t", "e", "m" * 500, cold(1000.0 + i))
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        path = state / "history.sqlite"
        size = path.stat().st_size
        with open(path, "r+b") as f:  # garbage over everything after the header page
            f.seek(4096)
            f.write(os.urandom(size - 4096))
        store._conn.execute("PRAGMA cache_size=0")  # stand in for pages long evicted
        store.starts("t", 100)
        assert store.check() == "lost_malformed"
        assert list(state.glob("history.sqlite.corrupt-*"))
    finally:
        store.close()
    starts, saved = _reopened(state)
    assert len(starts) == 51 and saved is not None


def test_the_daemon_reports_a_deleted_state_directory_on_every_tick_until_fixed(tmp_path):
    state = tmp_path / "state"
    daemon = Daemon(Settings(interval_seconds=1.0, state_directory=str(state), nvml=False))
    try:
        history = [s for s in daemon.tick().sources if s.source == "history"]
        assert [s.up for s in history] == [True]
        shutil.rmtree(state)
        for _ in range(3):  # every tick, so InferenceExporterSourceDown can fire
            (status,) = [s for s in daemon.tick().sources if s.source == "history"]
            assert (status.up, status.error) == (False, "lost_deleted")
        assert (state / "history.sqlite").exists()  # writing again meanwhile
    finally:
        daemon.close()


def test_a_store_overwritten_with_garbage_is_seen_at_once_and_earlier_runs_kept(tmp_path):
    """Before: unseen for a minute (until sqlite read a page it no longer cached), and the
    next start found garbage: every earlier run's starts were gone."""
    state = tmp_path / "state"
    earlier = History.open(str(state))
    earlier.record("t", "e", "m", cold(100.0))
    earlier.record("t", "e", "m", cold(200.0))
    earlier.close()
    store = History.open(str(state))  # the next run
    try:
        store.record("t", "e", "m", cold(300.0))
        assert store.check() is None
        path = state / "history.sqlite"
        with open(path, "r+b") as f:  # garbage over the whole file, in place
            f.write(os.urandom(path.stat().st_size))
        assert store.check() == "lost_malformed"  # on the next tick
        assert list(state.glob("history.sqlite.corrupt-*"))
    finally:
        store.close()
    starts, _ = _reopened(state)
    assert starts == [300.0, 200.0, 100.0]


@pytest.mark.integration
def test_starts_that_end_while_the_disk_is_full_are_written_once_it_has_room(tmp_path):
    """Before: 5 of 8 kept (those that ended while full were never written)."""
    mount = _tiny_disk(tmp_path)
    try:
        store = History.open(str(mount))
        try:
            for i in range(5):
                store.record("t", "e", "m", cold(float(i)))
            _fill(mount / "filler")
            recorded = 5
            for i in range(5, 200):  # enough rows to need pages the disk has no room for
                store.record("t", "e", "m" * 200, cold(float(i)))
                recorded += 1
                if store.errors >= 3:
                    break
            assert store.check() == "write_failed"
            os.unlink(mount / "filler")
            assert store.check() is None
        finally:
            store.close()
        starts, _ = _reopened(mount)
        assert starts == [float(i) for i in reversed(range(recorded))]  # none lost
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
