"""The simulated engine: real processes on loopback, watched the way the exporter will watch them.

Most tests start ``python -m exporter_tooling.simulate`` with a short schedule (8 MiB at 12 MiB/s,
init 1 s) and observe it from outside: HTTP probes, /proc via psutil, the GPU state file, the log
file.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from exporter_tooling.processes import free_port
from exporter_tooling.simulate.gpustate import (
    CUDA_GRAPH_BYTES,
    KV_CACHE_BYTES,
    GpuLoad,
    render_gpu_state,
    used_bytes,
    weights_on_gpu,
)
from exporter_tooling.simulate.plan import ALIGN, MIB, SimEngine, shard_sizes, weight_layout
from exporter_tooling.simulate.script import SCRIPTS, shard_bar
from exporter_tooling.simulate.server import LOADING_BODY, Health, respond

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS_MB = 8
WEIGHTS = WEIGHTS_MB * MIB
FAST = ("--weights-mb", str(WEIGHTS_MB), "--read-mbps", "12", "--start-seconds", "0.3")
GPU_LINE = re.compile(r"^gpu (\d+) (GPU-[0-9a-f-]{36}) (\S+) (\d+) (\d+) (\d+) (\d+)$")
PROC_LINE = re.compile(r"^proc (\d+) (\d+) (\d+)$")
REFUSED = "refused"

Outcome = tuple[object, str]  # ("refused", "") or (status, body)


# --- helpers ----------------------------------------------------------------------------


@dataclass
class GpuState:
    gpus: list[tuple[int, str, str, int, int, int, int]]
    procs: list[tuple[int, int, int]]

    @property
    def used(self) -> int:
        return self.gpus[0][4]

    @property
    def util(self) -> int:
        return self.gpus[0][5]


def parse_gpu_state(text: str) -> GpuState:
    """Parse the state file strictly: every line is a gpu or a proc line."""
    state = GpuState([], [])
    for line in text.splitlines():
        if m := GPU_LINE.match(line):
            i, uuid, name, total, used, util, mem = m.groups()
            state.gpus.append((int(i), uuid, name, int(total), int(used), int(util), int(mem)))
        elif m := PROC_LINE.match(line):
            state.procs.append((int(m[1]), int(m[2]), int(m[3])))
        else:
            raise AssertionError(f"unexpected line in GPU state file: {line!r}")
    return state


class Sim:
    """One simulator process with its files, probed from outside."""

    def __init__(self, tmp: Path, engine: str, *flags: str, gpus: int = 1) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = tmp / "engine.log"
        self.gpu_path = tmp / "gpu.state"
        self.work = tmp / "weights"
        self.stdout_lines: list[str] = []
        self._stderr = (tmp / "stderr").open("w")
        args = [
            *("--port", str(self.port), "--engine", engine, "--gpus", str(gpus)),
            *("--log-file", str(self.log_path), "--gpu-state-file", str(self.gpu_path)),
            *("--work-dir", str(self.work), "--pid-file", str(tmp / "pid")),
            *FAST,
            *flags,
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter_tooling.simulate", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.main = psutil.Process(self.proc.pid)
        self.http = httpx.Client(trust_env=False, timeout=2.0)
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout_lines.append(line.rstrip("\n"))

    def __enter__(self) -> Sim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._stderr.close()
        self.http.close()

    @property
    def ready_at(self) -> float | None:
        for line in self.stdout_lines:
            if m := re.fullmatch(r"SIMULATOR ready_at=(\d+\.\d+) pid=(\d+)", line):
                assert int(m[2]) == self.proc.pid
                return float(m[1])
        return None

    def request(self, method: str, path: str, body: object = None) -> Outcome:
        try:
            r = self.http.request(method, f"http://127.0.0.1:{self.port}{path}", json=body)
        except httpx.ConnectError:
            return (REFUSED, "")
        return (r.status_code, r.text)

    def health(self) -> Outcome:
        return self.request("GET", "/health")

    def complete(self) -> Outcome:
        body = {"model": "m", "prompt": "2+2=", "max_tokens": 4, "temperature": 0}
        return self.request("POST", "/v1/completions", body)

    def workers(self) -> list[psutil.Process]:
        return self.main.children()

    def read_bytes(self) -> int:
        return sum(w.io_counters().read_bytes for w in self.workers())

    def worker_rss(self) -> int:
        return sum(w.memory_info().rss for w in self.workers())

    def tree_cpu(self) -> float:
        procs = [self.main, *self.workers()]
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

    def gpu(self) -> GpuState:
        return parse_gpu_state(self.gpu_path.read_text())

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stderr(self) -> str:
        self._stderr.flush()
        return Path(self._stderr.name).read_text()

    def wait_for(self, what: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert self.proc.poll() is None, f"simulator exited {self.proc.returncode}"
            assert time.monotonic() < deadline, "condition not met in time"
            time.sleep(0.03)

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout=timeout)


def distinct(outcomes: list[Outcome]) -> list[Outcome]:
    """Consecutive duplicates collapsed: the states the server went through."""
    return [o for i, o in enumerate(outcomes) if i == 0 or o != outcomes[i - 1]]


def assert_in_order(text: str, patterns: list[str]) -> None:
    lines = text.splitlines()
    at = 0
    for pattern in patterns:
        found = next((i for i in range(at, len(lines)) if re.search(pattern, lines[i])), None)
        assert found is not None, f"no line matching {pattern!r} after line {at}"
        at = found + 1


# --- one healthy cold start per engine, recorded once, asserted by several tests ---------------


@dataclass
class HealthyRun:
    engine: str
    weights_dir: Path
    timeline: list[tuple[float, Outcome]] = field(default_factory=list)  # (answered at, outcome)
    gpu: list[GpuState] = field(default_factory=list)
    while_loading: dict[str, Outcome] = field(default_factory=dict)
    ready_at: float = 0.0
    worker_pids: list[int] = field(default_factory=list)
    read_bytes: int = 0
    completion: Outcome = (0, "")
    log: str = ""
    stop_rc: int | None = None
    stop_seconds: float = 0.0
    alive_after_stop: list[int] = field(default_factory=list)
    files_after_stop: list[str] = field(default_factory=list)
    gpu_after_stop: GpuState | None = None


def record_healthy_run(sim: Sim, engine: str) -> HealthyRun:
    run = HealthyRun(engine, sim.work)
    done = threading.Event()
    sampler = threading.Thread(target=_sample_gpu, args=(sim, run.gpu, done))
    sampler.start()
    try:
        _probe_until_ready(sim, run)
    finally:
        done.set()
        sampler.join()
    run.ready_at = sim.ready_at or 0.0
    run.worker_pids = [w.pid for w in sim.workers()]
    run.read_bytes = sim.read_bytes()
    run.completion = sim.complete()
    run.log = sim.log()
    started = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    run.stop_rc = sim.wait_exit(timeout=10)
    run.stop_seconds = time.monotonic() - started
    run.alive_after_stop = [p for p in run.worker_pids if psutil.pid_exists(p)]
    run.files_after_stop = sorted(p.name for p in sim.work.iterdir())
    run.gpu_after_stop = sim.gpu()
    return run


ENGINES = ("vllm", "sglang", "llamacpp")
#: Loading takes about a second, so the 0.2 s GPU state rewrites catch it climbing.
HEALTHY_FLAGS = ("--read-mbps", "8", "--init-seconds", "0.6")


def _probe_until_ready(sim: Sim, run: HealthyRun) -> None:
    ready_seen: float | None = None
    deadline = time.monotonic() + 20
    while ready_seen is None or time.monotonic() - ready_seen < 0.5:
        assert time.monotonic() < deadline and sim.proc.poll() is None
        outcome = sim.health()
        run.timeline.append((time.time(), outcome))  # when the answer was in
        if outcome[0] == 503 and sim.ready_at is None and not run.while_loading:
            run.while_loading = {
                "completions": sim.complete(),
                "models": sim.request("GET", "/v1/models"),
            }
        if ready_seen is None and sim.ready_at is not None:
            ready_seen = time.monotonic()
        time.sleep(0.03)


def _sample_gpu(sim: Sim, samples: list[GpuState], done: threading.Event) -> None:
    while not done.wait(0.04):
        if sim.gpu_path.exists():
            samples.append(sim.gpu())


@pytest.fixture(scope="module")
def healthy_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HealthyRun]:
    """The three engines cold-start side by side (the recording mostly waits), once per module."""
    with ExitStack() as stack:
        sims = {
            engine: stack.enter_context(
                Sim(tmp_path_factory.mktemp(engine), engine, *HEALTHY_FLAGS, gpus=2)
            )
            for engine in ENGINES
        }
        with ThreadPoolExecutor(len(sims)) as pool:
            futures = {e: pool.submit(record_healthy_run, sim, e) for e, sim in sims.items()}
            return {engine: future.result() for engine, future in futures.items()}


@pytest.fixture(params=ENGINES)
def healthy(request: pytest.FixtureRequest, healthy_runs: dict[str, HealthyRun]) -> HealthyRun:
    return healthy_runs[str(request.param)]


EXPECTED_HEALTH = {
    # vLLM and SGLang refuse connections until ready; SGLang then warms up behind a 503.
    "vllm": [(REFUSED, ""), (200, "")],
    "sglang": [(REFUSED, ""), (503, ""), (200, "")],
    # llama.cpp listens first and answers "Loading model" until the model is in.
    "llamacpp": [(503, LOADING_BODY.decode()), (200, '{"status":"ok"}')],
}


@pytest.mark.integration
def test_health_goes_through_the_engines_states_in_order(healthy: HealthyRun) -> None:
    states = distinct([o for _, o in healthy.timeline])
    if healthy.engine == "llamacpp" and states[0] == (REFUSED, ""):
        states = states[1:]  # the few milliseconds before it binds
    assert states == EXPECTED_HEALTH[healthy.engine]


@pytest.mark.integration
def test_ready_line_is_when_health_first_answers_200(healthy: HealthyRun) -> None:
    # Times are when each answer arrived: no 200 may arrive before the announced ready time.
    first_200 = next(t for t, (status, _) in healthy.timeline if status == 200)
    before = [o for t, o in healthy.timeline if t < healthy.ready_at]
    assert before and all(status != 200 for status, _ in before)
    assert healthy.ready_at <= first_200 < healthy.ready_at + 2.0


@pytest.mark.integration
def test_completion_after_ready_has_choices(healthy: HealthyRun) -> None:
    status, body = healthy.completion
    assert status == 200
    choice = json.loads(body)["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert len(choice["text"].split()) == 4


@pytest.mark.integration
def test_other_routes_while_health_says_503_follow_the_engine(healthy: HealthyRun) -> None:
    routes = healthy.while_loading
    if healthy.engine == "llamacpp":
        loading = (503, LOADING_BODY.decode())
        assert routes == {"completions": loading, "models": loading}
    elif healthy.engine == "sglang":
        # Its warm-up is a real generation: requests are served while /health still says 503.
        assert routes["completions"][0] == 200 and routes["models"][0] == 200
    else:
        assert routes == {}, "vLLM never answers 503 during a healthy start"


@pytest.mark.integration
def test_workers_read_the_weights_from_disk(healthy: HealthyRun) -> None:
    assert len(healthy.worker_pids) == 2  # one per simulated GPU
    # O_DIRECT reads are charged to read_bytes; a few KiB of probes and imports on top.
    assert WEIGHTS <= healthy.read_bytes < WEIGHTS * 1.25


@pytest.mark.integration
def test_gpu_memory_is_zero_then_climbs_with_the_load_then_plateaus(healthy: HealthyRun) -> None:
    used = [s.used for s in healthy.gpu]
    assert used[0] == 0 and all(s.procs == [] for s in healthy.gpu if s.used == 0)
    assert used == sorted(used), "GPU memory never goes down during a healthy start"
    weights = weights_on_gpu(WEIGHTS)
    climbing = {u for u in used if 0 < u < weights}
    assert climbing, f"memory should climb with the bytes read, saw {sorted(set(used))}"
    plateau = weights + KV_CACHE_BYTES + CUDA_GRAPH_BYTES
    assert used[-1] == plateau and used.count(plateau) >= 2


@pytest.mark.integration
def test_gpu_state_attributes_each_gpu_to_its_own_worker(healthy: HealthyRun) -> None:
    last = healthy.gpu[-1]
    assert [g[0] for g in last.gpus] == [0, 1]
    assert len({g[1] for g in last.gpus}) == 2  # distinct UUIDs
    assert all(g[4] == last.used and g[3] > g[4] for g in last.gpus)
    assert sorted((gpu, pid) for gpu, pid, _ in last.procs) == list(enumerate(healthy.worker_pids))
    assert all(mem == last.used for _, _, mem in last.procs)


@pytest.mark.integration
def test_gpu_is_busy_only_during_warm_up(healthy: HealthyRun) -> None:
    weights = weights_on_gpu(WEIGHTS)
    loading = [s.util for s in healthy.gpu if s.used <= weights]
    initializing = [s.util for s in healthy.gpu if s.used > weights]
    assert set(loading) == {0}
    assert max(initializing) > 50
    assert healthy.gpu[-1].util == 0  # ready and idle


LOG_ANCHORS = {
    "vllm": [
        r"^INFO \d\d-\d\d \d\d:\d\d:\d\d \[core\.py:\d+\] Initializing a V1 LLM engine",
        r"^INFO \d\d-\d\d \d\d:\d\d:\d\d \[gpu_model_runner\.py:\d+\] Starting to load model ",
        r"^Loading safetensors checkpoint shards:   0% Completed \| 0/5 \[00:00<\?, \?it/s\]$",
        r"^Loading safetensors checkpoint shards:  40% Completed \| 2/5 \[",
        r"^Loading safetensors checkpoint shards: 100% Completed \| 5/5 \[",
        r"\] Loading weights took \d+\.\d\d seconds$",
        r"\] GPU KV cache size: [\d,]+ tokens$",
        r"\] Graph capturing finished in \d+ secs",
        r"\] init engine \(profile, create kv cache, warmup model\) took \d+\.\d\d seconds$",
        r"\] Starting vLLM API server 0 on http://127\.0\.0\.1:\d+$",
        r'^INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK$',
    ],
    "sglang": [
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=ServerArgs\(",
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Load weight begin\. avail mem=\d+\.\d\d GB$",
        r"^\[[\d :-]+ TP1\] Load weight begin\.",
        r"^Loading safetensors checkpoint shards: 100% Completed \| 5/5 \[",
        r"^\[[\d :-]+ TP0\] Load weight end\. .*mem usage=\d+\.\d\d GB\.$",
        r"^\[[\d :-]+ TP1\] KV Cache is allocated\. #tokens: \d+",
        r"^\[[\d :-]+ TP0\] Capture cuda graph end\. Time elapsed: \d+\.\d\d s",
        r"^\[[\d :-]+\] INFO:     Uvicorn running on http://127\.0\.0\.1:\d+",
        r'^\[[\d :-]+\] INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 503 Service',
        r"^\[[\d :-]+\] The server is fired up and ready to roll!$",
    ],
    "llamacpp": [
        r"^main: HTTP server is listening, hostname: 127\.0\.0\.1, port: \d+",
        r"^main: loading model$",
        r"^load_tensors: offloaded 81/81 layers to GPU$",
        r"^\.{50}$",
        r"^llama_kv_cache:      CUDA0 KV buffer size = \d+\.\d\d MiB$",
        r"^main: model loaded$",
        r"^main: server is listening on http://127\.0\.0\.1:\d+ - starting the main loop$",
        r"^srv  update_slots: all slots are idle$",
    ],
}


@pytest.mark.integration
def test_log_lines_use_the_engines_real_format_in_phase_order(healthy: HealthyRun) -> None:
    assert_in_order(healthy.log, LOG_ANCHORS[healthy.engine])


@pytest.mark.integration
def test_sigterm_after_ready_exits_0_and_leaves_nothing_behind(healthy: HealthyRun) -> None:
    assert healthy.stop_rc == 0
    assert healthy.stop_seconds < 5
    assert healthy.alive_after_stop == []
    assert healthy.files_after_stop == []
    assert healthy.gpu_after_stop is not None
    assert healthy.gpu_after_stop.used == 0 and healthy.gpu_after_stop.procs == []


# --- failure scenarios ------------------------------------------------------------------


@pytest.mark.integration
def test_hang_loading_stops_reading_halfway_and_goes_quiet(tmp_path: Path) -> None:
    with Sim(tmp_path, "vllm", "--scenario", "hang-loading", "--init-seconds", "1") as sim:
        sim.wait_for(lambda: sim.gpu_path.exists() and sim.gpu().used > 0)
        sim.wait_for(lambda: _steady(sim.read_bytes, 0.5))
        before = (sim.read_bytes(), sim.log(), sim.gpu().used, sim.tree_cpu())
        time.sleep(1.0)
        after = (sim.read_bytes(), sim.log(), sim.gpu().used, sim.tree_cpu())
        assert sim.proc.poll() is None
        assert after[:3] == before[:3]
        assert 0.3 * WEIGHTS < after[0] < 0.8 * WEIGHTS
        assert after[3] - before[3] < 0.1, "a hung engine is idle"
        assert sim.health() == (REFUSED, "")
        assert "Loading weights took" not in after[1]


@pytest.mark.integration
def test_hang_initializing_keeps_weights_and_kv_cache_and_goes_quiet(tmp_path: Path) -> None:
    with Sim(tmp_path, "sglang", "--scenario", "hang-initializing", "--init-seconds", "1") as sim:
        sim.wait_for(lambda: "KV Cache is allocated" in sim.log() and sim.gpu().util == 100)
        before = (sim.log(), sim.gpu(), sim.read_bytes(), sim.tree_cpu())
        time.sleep(1.0)
        assert sim.proc.poll() is None
        assert (sim.log(), sim.gpu(), sim.read_bytes()) == before[:3]
        assert before[1].used == weights_on_gpu(WEIGHTS) + KV_CACHE_BYTES
        # Pinned at 100 % like an NCCL hang: utilisation alone must not count as progress.
        assert before[1].util == 100
        assert sim.tree_cpu() - before[3] < 0.1
        assert sim.health() == (REFUSED, "")


def _steady(sample: Callable[[], int], seconds: float) -> bool:
    first = sample()
    time.sleep(seconds)
    return sample() == first


FATAL_LINES = {
    ("crash-loading", "vllm"): [
        r"^Traceback \(most recent call last\):$",
        r"^safetensors_rust\.Safe",
    ],
    ("crash-loading", "sglang"): [r"TP0\] Scheduler hit an exception: Traceback", r"^safetensors"],
    ("crash-loading", "llamacpp"): [
        r"^llama_model_load: error loading model: ",
        r"^main: exiting due to model loading error$",
    ],
    ("oom-initializing", "vllm"): [
        r"\] EngineCore failed to start\.$",
        r"^torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate 2\.00 GiB",
        r"^RuntimeError: Engine core initialization failed\. See root cause above\.",
    ],
    ("oom-initializing", "sglang"): [
        r"^torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate",
        r"\] Received sigquit from a child process\.",
    ],
    ("oom-initializing", "llamacpp"): [
        r"cudaMalloc failed: out of memory$",
        r"^main: exiting due to model loading error$",
    ],
}


@pytest.mark.integration
@pytest.mark.parametrize(("scenario", "engine"), sorted(FATAL_LINES))
def test_failed_start_prints_the_engines_fatal_lines_and_exits_1(
    tmp_path: Path, scenario: str, engine: str
) -> None:
    with Sim(tmp_path, engine, "--scenario", scenario, "--init-seconds", "0.4") as sim:
        sim.wait_for(lambda: len(sim.workers()) == 1)
        workers = sim.workers()
        assert sim.wait_exit() == 1
        assert sim.ready_at is None
        assert_in_order(sim.log(), FATAL_LINES[scenario, engine])
        assert not any(w.is_running() for w in workers)
        assert list(sim.work.iterdir()) == []
        assert sim.gpu().used == 0


@pytest.mark.integration
def test_crash_happens_midway_through_the_weights(tmp_path: Path) -> None:
    with Sim(tmp_path, "sglang", "--scenario", "crash-loading", "--gpus", "1") as sim:
        sim.wait_for(lambda: len(sim.workers()) == 1)
        worker = sim.workers()[0]
        seen = 0
        while sim.proc.poll() is None:
            try:
                seen = max(seen, worker.io_counters().read_bytes)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
        assert sim.wait_exit() == 1
        assert 0.3 * WEIGHTS < seen < 0.9 * WEIGHTS
        assert "Load weight begin" in sim.log() and "Load weight end" not in sim.log()


@pytest.mark.integration
def test_flap_serves_then_fails_health_then_recovers_while_alive(tmp_path: Path) -> None:
    flags = ("--scenario", "flap", "--flap-seconds", "0.5", "--init-seconds", "0.5")
    with Sim(tmp_path, "vllm", *flags) as sim:
        sim.wait_for(lambda: sim.ready_at is not None)
        seen: list[Outcome] = []
        failing_completion: Outcome | None = None
        deadline = time.monotonic() + 4
        while len(distinct(seen)) < 3 and time.monotonic() < deadline:
            seen.append(sim.health())
            if seen[-1][0] == 503 and failing_completion is None:
                failing_completion = sim.complete()
            time.sleep(0.03)
        assert sim.proc.poll() is None
        assert distinct(seen) == [(200, ""), (503, ""), (200, "")]
        assert failing_completion is not None and failing_completion[0] == 503


@pytest.mark.integration
def test_slow_start_is_silent_but_reads_computes_and_becomes_ready(tmp_path: Path) -> None:
    with Sim(tmp_path, "vllm", "--scenario", "slow", "--init-seconds", "1") as sim:
        # Past the load's first bar (reads before it can be a cold venv's imports), reading.
        sim.wait_for(lambda: "Completed | 0/5" in sim.log() and sim.read_bytes() > 0)
        lines, read, rss = sim.log().count("\n"), sim.read_bytes(), sim.worker_rss()
        time.sleep(0.3)
        assert sim.log().count("\n") == lines and sim.read_bytes() > read
        sim.wait_for(lambda: "Loading weights took" in sim.log())
        # Weights pile up in the worker's memory as they are read.
        assert sim.worker_rss() - rss > WEIGHTS / 2
        cpu = sim.tree_cpu()
        sim.wait_for(lambda: sim.ready_at is not None)
        assert sim.tree_cpu() - cpu > 0.05, "compiling keeps the CPU busy in bursts"
        log = sim.log()
        assert "% Completed | 2/5" not in log  # no shard progress in the silent stretch
        assert "GPU KV cache size" not in log  # nor while it compiles
        assert "init engine (profile, create kv cache, warmup model) took" in log


# --- shutdown and process tree ----------------------------------------------------------


@pytest.mark.integration
def test_sigterm_during_loading_exits_0_promptly_with_its_workers(tmp_path: Path) -> None:
    with Sim(tmp_path, "sglang", "--read-mbps", "2", gpus=2) as sim:
        sim.wait_for(lambda: sim.read_bytes() > 0)
        workers = sim.workers()
        started = time.monotonic()
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.wait_exit(timeout=10) == 0
        assert time.monotonic() - started < 3
        assert not any(w.is_running() for w in workers)
        assert list(sim.work.iterdir()) == []


@pytest.mark.integration
def test_workers_die_and_clean_up_when_the_main_process_is_killed(tmp_path: Path) -> None:
    with Sim(tmp_path, "vllm", "--read-mbps", "2", gpus=2) as sim:
        sim.wait_for(lambda: sim.read_bytes() > 0)
        workers = sim.workers()
        sim.proc.send_signal(signal.SIGKILL)
        sim.wait_exit()
        gone = psutil.wait_procs(workers, timeout=5)[0]
        assert len(gone) == 2
        deadline = time.monotonic() + 5
        while list(sim.work.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(sim.work.iterdir()) == []


@pytest.mark.integration
def test_pid_file_names_the_main_process(tmp_path: Path) -> None:
    with Sim(tmp_path, "llamacpp", "--read-mbps", "2") as sim:
        sim.wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text() != "")
        assert int((tmp_path / "pid").read_text()) == sim.proc.pid


# --- bad input --------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--read-mbps", "0"), "argument --read-mbps: must be more than 0, got '0'"),
        (("--gpus", "17"), "argument --gpus: must be 1-16, got '17'"),
        (("--engine", "tgi"), "argument --engine: invalid choice: 'tgi'"),
    ],
)
def test_bad_flags_exit_2_with_one_clear_line(flags: tuple[str, ...], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter_tooling.simulate", "--port", "1", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert message in result.stderr.splitlines()[-1]


@pytest.mark.integration
def test_port_in_use_exits_2_naming_the_flag(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter_tooling.simulate",
                "--port",
                str(port),
                "--work-dir",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"simulate: --port: cannot bind 127.0.0.1:{port}: Address already in use"
    )
    assert list(tmp_path.iterdir()) == []


# --- pure parts -------------------------------------------------------------------------


@pytest.mark.parametrize("engine", list(SimEngine))
def test_health_replies_follow_each_engine(engine: SimEngine) -> None:
    def health(state: Health) -> tuple[int, bytes]:
        reply = respond(engine, state, "GET", "/health", b"", "m")
        return reply.status, reply.body

    ok_body = b'{"status":"ok"}' if engine is SimEngine.LLAMACPP else b""
    assert health(Health.READY) == (200, ok_body)
    assert health(Health.FAILING)[0] == 503
    assert health(Health.WARMING)[0] == 503


def test_loading_llamacpp_answers_every_route_with_loading_model() -> None:
    for method, path in [("GET", "/health"), ("POST", "/v1/completions"), ("GET", "/nope")]:
        reply = respond(SimEngine.LLAMACPP, Health.LOADING, method, path, b"{}", "m")
        assert (reply.status, reply.body) == (503, LOADING_BODY)


@pytest.mark.parametrize(
    "body", [b"not json", b"[1]", b'{"max_tokens": 0}', b'{"max_tokens": "4"}']
)
def test_bad_completion_requests_get_400(body: bytes) -> None:
    assert respond(SimEngine.VLLM, Health.READY, "POST", "/v1/completions", body, "m").status == 400


def test_completion_echoes_the_model_and_counts_tokens() -> None:
    body = b'{"model": "my-model", "prompt": "2+2=", "max_tokens": 3}'
    doc = json.loads(
        respond(SimEngine.SGLANG, Health.READY, "POST", "/v1/completions", body, "m").body
    )
    assert doc["model"] == "my-model"
    assert doc["usage"] == {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    assert doc["choices"][0]["text"] == " the model is"


def test_gpu_state_text_has_one_line_per_gpu_and_per_owner() -> None:
    load = GpuLoad(weights_fraction=0.5, util=7, mem_util=3)
    state = parse_gpu_state(render_gpu_state(3, [11, 12, 13], load, WEIGHTS))
    expected = used_bytes(load, WEIGHTS)
    assert [g[4] for g in state.gpus] == [expected] * 3 and expected == weights_on_gpu(WEIGHTS) // 2
    assert [(g[5], g[6]) for g in state.gpus] == [(7, 3)] * 3
    assert state.procs == [(0, 11, expected), (1, 12, expected), (2, 13, expected)]
    empty = parse_gpu_state(render_gpu_state(2, [11, 12], GpuLoad(), WEIGHTS))
    assert empty.procs == [] and {g[4] for g in empty.gpus} == {0}


def test_default_weights_fill_a_gpu_like_a_large_model() -> None:
    # DESIGN.md: GPU memory climbs to about 76 GB per card of 80 GB.
    full = used_bytes(GpuLoad(1.0, kv_cache=True, graphs=True), 640 * MIB)
    total = parse_gpu_state(render_gpu_state(1, [1], GpuLoad(), 0)).gpus[0][3]
    assert 74e9 < full < 0.95 * total


def test_shard_bar_matches_the_real_vllm_line() -> None:
    # shared/fixtures/logs/vllm-06-ready.log
    real = "Loading safetensors checkpoint shards:  25% Completed | 1/4 [00:00<00:02,  1.06it/s]"
    bar = shard_bar(SCRIPTS[SimEngine.VLLM].shard_bar, 1, 4, 1 / 1.06)
    assert bar == real
    assert shard_bar(SCRIPTS[SimEngine.VLLM].shard_bar, 1, 4, 40.0).endswith(
        "[00:40<02:00, 40.00s/it]"
    )


def test_weight_layout_is_aligned_for_o_direct_and_covers_every_byte() -> None:
    for engine in SimEngine:
        segments = weight_layout(engine, Path("/w"), 8 * MIB + 3 * ALIGN)
        assert sum(s.length for s in segments) == 8 * MIB + 3 * ALIGN
        assert all(s.offset % ALIGN == 0 and s.length % ALIGN == 0 for s in segments)
    assert len({s.path for s in weight_layout(SimEngine.LLAMACPP, Path("/w"), 8 * MIB)}) == 1
    assert shard_sizes(ALIGN, 5) == [ALIGN]
