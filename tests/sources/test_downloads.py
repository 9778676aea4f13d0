"""Download files held open by a real child process, found through /proc/PID/fd."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.sources.process.downloads import DownloadWatch, open_downloads

HOLDER = """
import sys, time
files = [open(p, "wb") for p in sys.argv[1:]]
print("open", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    names = ["blobs/abc.incomplete", "sha256-1f2e-partial", "model.safetensors", "x.part"]
    (tmp_path / "blobs").mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *(str(tmp_path / n) for n in names)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "open\n"
    yield child
    child.kill()
    child.wait()
    child.stdout.close()


def test_files_a_downloader_is_still_writing_are_counted_and_others_not(holder):
    assert open_downloads([holder.pid]) == 3  # .incomplete, -partial, .part; not the weights


def test_a_gone_process_counts_nothing(holder):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert open_downloads([ended.pid, holder.pid]) == 3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_looks_only_while_the_tree_writes_and_then_every_few_seconds(holder):
    clock = Clock()
    watch = DownloadWatch(every_seconds=5.0, clock=clock)
    assert watch.count([holder.pid], 100) == 0  # first sample: nothing written yet to compare
    assert watch.count([holder.pid], 100) == 0  # nothing written since: no look at all
    assert watch.count([holder.pid], 5000) == 3  # writing: looked
    holder.kill()
    holder.wait()
    clock.now += 1
    assert watch.count([holder.pid], 9000) == 3  # within 5 s: the last look stands
    clock.now += 5
    assert watch.count([holder.pid], 9000) == 0  # looked again: the download is gone
