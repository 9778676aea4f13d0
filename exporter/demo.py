"""The ``demo`` subcommand: the exporter watching a simulated engine through a cold start.

Starts ``simulate`` as a real child process (real HTTP server, real weight file read from
disk, real log file, simulated GPUs through a simulated ``libnvidia-ml.so.1`` and the same
NVML code path as a GPU host), then runs the daemon against it until Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from exporter.cli import add_web_and_log_flags, configure_logging, serve
from exporter.config import CompletionProbe, Settings, Target
from exporter.simulate.gpustate import GpuLoad, render_gpu_state, write_atomically

log = logging.getLogger(__name__)
SCENARIOS = (
    "healthy",
    "slow",
    "hang-loading",
    "hang-initializing",
    "crash-loading",
    "oom-initializing",
    "flap",
)


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``demo``: the web and log flags of ``run`` plus the simulated scenario."""
    p.add_argument(
        "--scenario",
        default="healthy",
        choices=SCENARIOS,
        help="what the simulated engine does (default healthy)",
    )
    p.add_argument(
        "--engine",
        default="sglang",
        choices=["sglang", "vllm", "llamacpp"],
        help="which engine's HTTP semantics and log format to simulate",
    )
    p.add_argument("--gpus", type=int, default=2, help="simulated GPUs (default 2)")
    p.add_argument("--weights-mb", type=int, default=640, help="weight file size (MB)")
    p.add_argument("--read-mbps", type=float, default=25.0, help="weight read rate (MB/s)")
    p.add_argument("--init-seconds", type=float, default=20.0, help="initialisation time")
    p.add_argument("--start-seconds", type=float, default=5.0, help="time before loading")
    p.add_argument("--interval", type=float, default=1.0, help="sampling interval, seconds")
    add_web_and_log_flags(p)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def demo_settings(
    work: Path, port: int, interval: float, engine: str, nvml_dir: str | None
) -> Settings:
    """The config the demo runs with: one target named ``demo`` watching the simulator."""
    target = Target(
        name="demo",
        engine=engine,
        base_url=f"http://127.0.0.1:{port}",
        health_path="/health",
        probe_timeout_seconds=min(0.8, interval * 0.8),
        completion=CompletionProbe(model="demo", prompt="2+2=", max_tokens=4, interval_seconds=5.0),
        pidfile=str(work / "engine.pid"),
        log_file=str(work / "engine.log"),
        model_path=str(work / "weights"),
        deployment="demo",
        model="simulated-70b",
    )
    return Settings(
        interval_seconds=interval,
        state_directory=str(work / "state"),
        targets=(target,),
        nvml=nvml_dir is not None,
        nvml_library_dir=nvml_dir,
    )


def simulator_command(args: argparse.Namespace, work: Path, port: int) -> list[str]:
    """The ``simulate`` command line the demo runs."""
    return [
        sys.executable,
        "-m",
        "exporter",
        "simulate",
        "--port",
        str(port),
        "--engine",
        args.engine,
        "--scenario",
        args.scenario,
        "--weights-mb",
        str(args.weights_mb),
        "--read-mbps",
        str(args.read_mbps),
        "--start-seconds",
        str(args.start_seconds),
        "--init-seconds",
        str(args.init_seconds),
        "--log-file",
        str(work / "engine.log"),
        "--pid-file",
        str(work / "engine.pid"),
        "--gpus",
        str(args.gpus),
        "--gpu-state-file",
        str(work / "gpus.state"),
        "--work-dir",
        str(work / "weights"),
    ]


def _build_nvml(work: Path) -> str | None:
    from exporter.simnvml import SimulatedNvmlBuildError, build_simulated_nvml

    try:
        return str(build_simulated_nvml(work / "nvml").parent)
    except SimulatedNvmlBuildError as exc:
        log.warning("simulated GPUs off: cannot build the simulated NVML library error=%s", exc)
        return None


def _stop_engine(sim: subprocess.Popen[bytes]) -> None:
    sim.terminate()
    try:
        sim.wait(timeout=10)
    except subprocess.TimeoutExpired:
        sim.kill()
        sim.wait()


def run(args: argparse.Namespace) -> int:
    """Run the simulator and the exporter until Ctrl-C."""
    configure_logging(args.log_level, args.log_format)
    work = Path(tempfile.mkdtemp(prefix="inference-lifecycle-demo-"))
    (work / "weights").mkdir()
    port = free_port()
    nvml_dir = _build_nvml(work)
    settings = demo_settings(work, port, args.interval, args.engine, nvml_dir)
    # The host's GPUs exist, idle, before any engine starts (NVML enumerates them at init).
    write_atomically(work / "gpus.state", render_gpu_state(args.gpus, [], GpuLoad(), 0))
    engines: list[subprocess.Popen[bytes]] = []

    def start_engine() -> None:
        # After the exporter's first tick, so the whole cold start is watched from "down".
        engines.append(
            subprocess.Popen(simulator_command(args, work, port), stdout=subprocess.DEVNULL)
        )

    listen = args.listen_address
    shown = listen if not listen.startswith(":") else "localhost" + listen
    print(
        f"demo: simulated {args.engine} engine ({args.scenario}) on http://127.0.0.1:{port}\n"
        f"demo: exporter on http://{shown}/  metrics: http://{shown}/metrics  "
        f"status: http://{shown}/status\n"
        f"demo: watch it: inference-lifecycle-exporter wait demo --url http://{shown}\n"
        f"demo: press Ctrl-C to stop",
        flush=True,
    )
    try:
        return serve(
            settings,
            listen,
            args.web_config_file,
            stop=threading.Event(),
            gpu_env={"SIMULATED_NVML_STATE": str(work / "gpus.state")},
            on_first_tick=start_engine,
        )
    finally:
        for sim in engines:
            _stop_engine(sim)
        shutil.rmtree(work, ignore_errors=True)
