"""The ``demo`` subcommand: the exporter watching a simulated engine through a cold start.

Starts ``simulate`` as a real child process (real HTTP server, real weight file read from
disk, real log file, simulated GPUs through a simulated ``libnvidia-ml.so.1`` and the same
NVML code path as a GPU host, or with ``--gpu-vendor amd`` a simulated ``libamd_smi.so`` behind
the real ``amdsmi`` binding), then runs the daemon against it until Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from exporter.cli import add_web_and_log_flags, configure_logging, serve
from exporter.config import CompletionProbe, Settings, Target
from exporter_tooling import fakeamdsmi, fakenvml
from exporter_tooling.cbuild import SimulatedLibraryBuildError
from exporter_tooling.processes import free_port, stop_process
from exporter_tooling.simulate.gpustate import GpuLoad, render_gpu_state, write_gpu_state
from exporter_tooling.simulate.launcher import SimulatorFiles, SimulatorSpec, simulator_argv
from exporter_tooling.simulate.plan import GPU_NAME, Scenario, SimEngine
from exporter_tooling.simulate.script import SCRIPTS

log = logging.getLogger(__name__)
#: The simulator's own scenarios and engines, in its order, so the two commands never differ.
SCENARIOS = tuple(s.value for s in Scenario)
ENGINES = tuple(e.value for e in SimEngine)
GPU_VENDORS = ("nvidia", "amd")
#: What ``--gpu-vendor amd`` simulates: the MI300X's name as amd-smi reports its market name.
AMD_GPU_NAME = "AMD-Instinct-MI300X"


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
        default=None,
        choices=ENGINES,
        help="which engine's HTTP semantics and log format to simulate (default sglang; "
        "vllm for sleep-wake, the engine with a sleep mode)",
    )
    p.add_argument("--gpus", type=int, default=2, help="simulated GPUs (default 2)")
    p.add_argument(
        "--gpu-vendor",
        default="nvidia",
        choices=GPU_VENDORS,
        help="whose simulated GPUs: nvidia (NVML) or amd (amd-smi); default nvidia",
    )
    p.add_argument("--weights-mb", type=int, default=640, help="weight file size (MB)")
    p.add_argument("--read-mbps", type=float, default=25.0, help="weight read rate (MB/s)")
    p.add_argument("--init-seconds", type=float, default=20.0, help="initialisation time")
    p.add_argument("--start-seconds", type=float, default=5.0, help="time before loading")
    p.add_argument("--interval", type=float, default=1.0, help="sampling interval, seconds")
    add_web_and_log_flags(p)


def demo_settings(
    files: SimulatorFiles,
    port: int,
    interval: float,
    engine: str,
    nvml_dir: str | None,
    amdsmi_dir: str | None = None,
) -> Settings:
    """The config the demo runs with: one target named ``demo`` watching the simulator.

    Only the simulated vendor's library is watched: a real GPU of the host never mixes in.
    """
    target = Target(
        name="demo",
        engine=engine,
        base_url=f"http://127.0.0.1:{port}",
        health_path="/health",
        probe_timeout_seconds=min(0.8, interval * 0.8),
        completion=CompletionProbe(model="demo", prompt="2+2=", max_tokens=4, interval_seconds=5.0),
        pidfile=str(files.pid_file),
        log_file=str(files.log_file),
        model_path=str(files.weights),
        deployment="demo",
        model="simulated-70b",
    )
    return Settings(
        interval_seconds=interval,
        state_directory=str(files.directory / "state"),
        targets=(target,),
        nvml=nvml_dir is not None,
        nvml_library_dir=nvml_dir,
        amdsmi=amdsmi_dir is not None,
        amdsmi_library_dir=amdsmi_dir,
    )


def simulator_spec(args: argparse.Namespace, port: int) -> SimulatorSpec:
    """What the demo's simulated engine does, from the demo's flags."""
    return SimulatorSpec(
        port=port,
        scenario=args.scenario,
        engine=args.engine,
        weights_mb=args.weights_mb,
        read_mbps=args.read_mbps,
        start_seconds=args.start_seconds,
        init_seconds=args.init_seconds,
        gpus=args.gpus,
        gpu_name=AMD_GPU_NAME if args.gpu_vendor == "amd" else GPU_NAME,
    )


def _build_gpu_library(work: Path, vendor: str) -> str | None:
    """The directory of the simulated vendor library, or None (no GPUs) when it cannot build."""
    try:
        if vendor == "amd":
            return str(fakeamdsmi.build_simulated_amdsmi(work / "amdsmi").parent)
        return str(fakenvml.build_simulated_nvml(work / "nvml").parent)
    except SimulatedLibraryBuildError as exc:
        log.warning("simulated GPUs off: cannot build the %s library error=%s", vendor, exc)
        return None


def demo_engine(scenario: str, engine: str | None) -> str:
    """The engine to simulate: the one asked for, else one that can play ``scenario``.

    Raises:
        ValueError: the engine asked for cannot play the scenario (the message says which can).
    """
    needs_sleep = scenario == Scenario.SLEEP_WAKE.value
    able = [e.value for e in SimEngine if SCRIPTS[e].fall_asleep] if needs_sleep else ENGINES
    if engine is None:
        return "sglang" if "sglang" in able else able[0]
    if engine not in able:
        raise ValueError(
            f"--scenario {scenario} needs an engine with a sleep mode: {', '.join(able)}"
        )
    return engine


def run(args: argparse.Namespace) -> int:
    """Run the simulator and the exporter until Ctrl-C."""
    try:
        args.engine = demo_engine(args.scenario, args.engine)
    except ValueError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, args.log_format)
    files = SimulatorFiles(Path(tempfile.mkdtemp(prefix="inference-lifecycle-demo-"))).create()
    port = free_port()
    library_dir = _build_gpu_library(files.directory, args.gpu_vendor)
    amd = args.gpu_vendor == "amd"
    settings = demo_settings(
        files,
        port,
        args.interval,
        args.engine,
        None if amd else library_dir,
        library_dir if amd else None,
    )
    # The simulator writes one state file; either fake library reads its gpu/proc lines.
    state_env = fakeamdsmi.STATE_ENV if amd else fakenvml.STATE_ENV
    # The host's GPUs exist, idle, before any engine starts (NVML enumerates them at init).
    idle = render_gpu_state(args.gpus, [], GpuLoad(), 0, simulator_spec(args, port).gpu_name)
    write_gpu_state(files.gpu_state, idle)
    # The engine appends to its log once it starts, after the exporter's first tick: the file
    # is there (empty) before, as a deployed engine's log path is, so that tick does not
    # read the log source as down.
    files.log_file.touch()
    engines: list[subprocess.Popen[bytes]] = []

    def start_engine() -> None:
        # After the exporter's first tick, so the whole cold start is watched from "down".
        argv = simulator_argv(simulator_spec(args, port), files)
        engines.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))

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
            gpu_env={state_env: str(files.gpu_state)},
            on_first_tick=start_engine,
        )
    finally:
        for sim in engines:
            stop_process(sim)
        shutil.rmtree(files.directory, ignore_errors=True)
