"""Real process trees and real disk reads for the process and disk source tests.

The child programs are ordinary functions shipped to ``python -c`` with ``inspect.getsource``,
so they are linted with the tests yet start without importing pytest.
"""

from __future__ import annotations

import inspect
import json
import mmap
import os
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

MiB = 1 << 20
DATA_BYTES = 4 * MiB
REPO_ROOT = Path(__file__).resolve().parents[2]


def read_direct(path: str | Path) -> int:
    """Read a whole file with O_DIRECT, so the bytes come from the disk, not the page cache."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, MiB)  # page-aligned, as O_DIRECT requires
    offset = 0
    try:
        while (n := os.preadv(fd, [buf], offset)) > 0:
            offset += n
    finally:
        buf.close()
        os.close(fd)
    return offset


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll until ``predicate()`` holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.01)


def proc_state(pid: int) -> str:
    """One-letter state of ``pid`` from /proc/PID/stat ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return ""


def _tree_program() -> None:
    """A fake engine, run in a child: ``reaper TOKEN CFG`` or ``main main-TOKEN CFG``.

    The reaper is a child subreaper, so orphaned workers are reparented to it (outside the
    engine's tree) and everything is reaped; it leaves the main process a zombie when that
    exits with status 7. The main process forks workers on commands read from stdin.
    """
    import ctypes
    import json
    import mmap
    import os
    import signal
    import socket
    import subprocess
    import sys
    import threading
    import time

    role, name, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

    def reaper() -> None:
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0")[:3]]
        main = subprocess.Popen([*argv, "main", f"main-{name}", json.dumps(cfg)])
        signal.signal(signal.SIGTERM, lambda *_: finish())
        while True:
            keep = main.pid if _exit_status(main.pid) == 7 else None
            for pid in _children(os.getpid()):
                if pid != keep and _state(pid) == "Z":
                    os.waitpid(pid, 0)
            time.sleep(0.02)

    def finish() -> None:
        while kids := _children(os.getpid()):
            for pid in kids:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        os._exit(0)

    def _exit_status(pid: int) -> int | None:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return None
        return info.si_status if info else None

    def _children(pid: int) -> list[int]:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(w) for w in f.read().split()]

    def _state(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return ""

    data = os.open(cfg["file"], os.O_RDONLY | os.O_DIRECT) if cfg.get("file") else None

    def read_data() -> None:
        buf, offset = mmap.mmap(-1, 1 << 20), 0
        while data is not None and (n := os.preadv(data, [buf], offset)) > 0:
            offset += n
        buf.close()

    def worker(notify: int, read: bool = True) -> None:
        if read:
            read_data()
        os.write(notify, f"{os.getpid():>10}".encode())  # fixed width: writers share a pipe
        while True:
            signal.pause()

    def spawn_worker(read: bool) -> int:
        notify_r, notify_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            worker(notify_w, read)
        os.close(notify_w)
        os.read(notify_r, 10)  # the worker has read the data
        os.close(notify_r)
        return pid

    def spawn_nested() -> tuple[int, int]:
        """A middle process holding a reading grandchild; kill the middle to orphan it."""
        notify_r, notify_w = os.pipe()
        middle = os.fork()
        if middle == 0:
            if os.fork() == 0:
                worker(notify_w)
            worker(notify_w, False)
        os.close(notify_w)
        first, second = (int(os.read(notify_r, 10)) for _ in range(2))
        os.close(notify_r)
        return middle, first if first != middle else second

    churning = threading.Event()

    def churn() -> None:
        while churning.is_set():
            pid = os.fork()
            if pid == 0:
                time.sleep(0.002)
                os._exit(0)
            os.waitpid(pid, 0)

    def serve() -> None:
        listener: socket.socket | None = None
        print("ready", os.getpid(), flush=True)
        for line in sys.stdin:
            cmd, *args = line.split()
            reply = "ok"
            if cmd == "spawn":
                reply = f"worker {spawn_worker(args != ['idle'])}"
            elif cmd == "read":
                read_data()
            elif cmd == "kill":  # "kill PID nowait" leaves it a zombie until "reap PID"
                os.kill(int(args[0]), signal.SIGKILL)
                if args[1:] != ["nowait"]:
                    os.waitpid(int(args[0]), 0)
            elif cmd == "reap":
                os.waitpid(int(args[0]), 0)
            elif cmd == "nest":
                reply = "nest {} {}".format(*spawn_nested())
            elif cmd == "listen":
                listener = socket.socket()
                listener.bind(("127.0.0.1", 0))
                listener.listen()
                reply = f"port {listener.getsockname()[1]}"
            elif cmd == "unlisten" and listener is not None:
                listener.close()
            elif cmd == "churn":
                churning.set()
                threading.Thread(target=churn, daemon=True).start()
            elif cmd == "unchurn":
                churning.clear()
            elif cmd == "exit":
                print("bye", flush=True)
                os._exit(int(args[0]))
            print(reply, flush=True)

    if role == "reaper":
        reaper()
    if cfg.get("pidfile"):
        with open(cfg["pidfile"], "w") as f:
            f.write(f"{os.getpid()}\n")
    if cfg.get("uid") is not None:
        os.setuid(cfg["uid"])
    serve()


TREE_PROGRAM = inspect.getsource(_tree_program) + "\n_tree_program()\n"


class Tree:
    """A reaper running a fake engine main process; talk to the main process with ``ask``."""

    def __init__(self, token: str, **cfg: object) -> None:
        self.token = token
        self.reaper = subprocess.Popen(
            [sys.executable, "-c", TREE_PROGRAM, "reaper", token, json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.main_pid = int(self._line().split()[1])

    @property
    def regex(self) -> str:
        """A cmdline regex matching the main process and its forked workers only."""
        return rf"\bmain-{self.token}\b"

    def ask(self, command: str) -> str:
        """Send one command to the main process and return its one-line reply."""
        assert self.reaper.stdin is not None
        self.reaper.stdin.write(command + "\n")
        self.reaper.stdin.flush()
        return self._line()

    def spawn(self, *, read: bool = True) -> int:
        """Fork a worker (reading the data file first when ``read``); returns its pid."""
        return int(self.ask("spawn" if read else "spawn idle").split()[1])

    def _line(self, timeout: float = 20.0) -> str:
        assert self.reaper.stdout is not None
        ready, _, _ = select.select([self.reaper.stdout], [], [], timeout)
        if not ready:
            pytest.fail("fake engine did not answer")
        line = self.reaper.stdout.readline()
        if not line:
            pytest.fail("fake engine exited")
        return line.strip()

    def close(self) -> None:
        """Stop the reaper, which kills and reaps every process it holds."""
        if self.reaper.poll() is None:
            self.reaper.terminate()
            try:
                self.reaper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.reaper.pid, 9)
                self.reaper.wait()
        for stream in (self.reaper.stdin, self.reaper.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    """A 4 MiB file of random bytes, on disk (fsynced) so O_DIRECT reads hit the device."""
    path = tmp_path / "weights.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(DATA_BYTES))
        f.flush()
        os.fsync(f.fileno())
    return path


@pytest.fixture
def make_tree(data_file: Path) -> Iterator[Callable[..., Tree]]:
    """Start fake engines (reaper + main) that read ``data_file``; all stopped afterwards."""
    trees: list[Tree] = []

    def make(**cfg: object) -> Tree:
        cfg.setdefault("file", str(data_file))
        tree = Tree(uuid.uuid4().hex[:12], **cfg)
        trees.append(tree)
        return tree

    yield make
    for tree in trees:
        tree.close()


@pytest.fixture
def sleeper() -> Iterator[Callable[[], int]]:
    """Start real child processes that stand in for inference server workers (GPU tests)."""
    children: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        children.append(child)
        return child.pid

    yield start
    for child in children:
        child.kill()
        child.wait()
