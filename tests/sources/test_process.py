"""The process source against real process trees: finders, sums, faults (RELIABILITY 43-46, 48)."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import exporter.sources.process as process_source
from exporter.base.model import ProcessSample
from exporter.config import Target
from exporter.sources import TargetSeen, run_source
from exporter.sources.process import ProcessSource, exits
from tests.cgroupfs import cgroup_hierarchies
from tests.sources.conftest import (
    DATA_BYTES,
    REPO_ROOT,
    TREE_PROGRAM,
    Tree,
    proc_state,
    wait_for,
)

NOBODY = 65534
DAEMON = 1  # the fake engine's user when the exporter must not read its /proc/PID/io


def target(**finder: str) -> Target:
    """A target found by ``finder`` (unit, pidfile, cmdline, or base_url's port)."""
    base_url = finder.pop("base_url", "http://127.0.0.1:1")
    return Target(
        name="llm",
        engine="vllm",
        base_url=base_url,
        health_path="/health",
        probe_timeout_seconds=1.0,
        **finder,  # type: ignore[arg-type]
    )


def seen_at_rest(source: ProcessSource, yes: bool = True) -> None:
    """From now on sample ``source`` as the daemon does once the core saw the server at rest."""
    source.sample = functools.partial(ProcessSource.sample, source, seen=TargetSeen(at_rest=yes))


def sample(source: ProcessSource) -> ProcessSample:
    """A sample that must find the process."""
    found = source.sample()
    assert found is not None, "process not found"
    return found


@pytest.mark.integration
def test_tree_sums_rss_cpu_and_read_bytes_of_main_and_workers(make_tree, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="exporter.sources.process")
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    source = ProcessSource(target(pidfile=str(pidfile)))
    alone = sample(source)

    workers = {tree.spawn(), tree.spawn()}
    loaded = sample(source)
    sample(source)

    assert alone.pids == (tree.main_pid,)
    assert loaded.pid == tree.main_pid and loaded.pids[0] == tree.main_pid
    assert set(loaded.pids) == {tree.main_pid, *workers}
    assert loaded.read_bytes is not None and alone.read_bytes is not None
    assert loaded.read_bytes - alone.read_bytes >= 2 * DATA_BYTES  # O_DIRECT: real disk reads
    assert loaded.read_bytes_error is None
    assert loaded.rss_bytes > alone.rss_bytes > 0
    assert loaded.cpu_seconds >= alone.cpu_seconds > 0
    assert loaded.create_time == alone.create_time
    assert time.time() - 300 < loaded.create_time <= time.time()
    assert not loaded.zombie
    found = [r for r in caplog.records if r.getMessage().startswith("process found")]
    assert len(found) == 1  # edges, not ticks


@pytest.mark.integration
def test_a_process_start_reads_when_it_started_not_up_to_a_second_early():
    """/proc/stat's boot time is whole seconds: counted from it, a start read up to 1 s early.

    ``wait --started-after`` compares a start with a mark the caller took just before it.
    """
    marker = f"start-time-{uuid.uuid4().hex}"
    asked = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    try:
        found = sample(ProcessSource(target(cmdline=rf"\b{marker}\b")))
    finally:
        child.kill()
        child.wait()
    tick = 1 / os.sysconf("SC_CLK_TCK")  # /proc's start times are whole clock ticks
    assert found.pid == child.pid
    assert asked - tick <= found.create_time <= time.time(), (asked, found.create_time)


@pytest.mark.integration
def test_cmdline_regex_finds_the_main_process_not_its_forked_workers(make_tree, caplog):
    caplog.set_level(logging.DEBUG)
    tree = make_tree()
    worker = tree.spawn()  # a fork: its command line matches too

    found = sample(ProcessSource(target(cmdline=tree.regex)))

    assert found.pid == tree.main_pid
    assert worker in found.pids
    assert tree.token not in caplog.text  # the command line is never logged
    assert tree.token not in repr(found)


@pytest.mark.integration
def test_port_listener_is_found_and_kept_while_it_stops_listening(make_tree):
    tree = make_tree()
    worker = tree.spawn(read=False)  # forked before listen: holds no listener
    port = int(tree.ask("listen").split()[1])
    source = ProcessSource(target(base_url=f"http://127.0.0.1:{port}"))
    listening = sample(source)

    tree.ask("unlisten")  # as vLLM and SGLang refuse connections while they load
    refusing = sample(source)
    never_seen = ProcessSource(target(base_url=f"http://127.0.0.1:{port}")).sample()
    tree.ask("exit 0")
    wait_for(lambda: proc_state(tree.main_pid) == "")

    assert listening.pid == tree.main_pid and worker in listening.pids
    assert refusing.pid == tree.main_pid and refusing.create_time == listening.create_time
    assert never_seen is None
    assert source.sample() is None


def test_absent_process_is_a_valid_observation_not_a_failure(tmp_path):
    sources = [
        ProcessSource(target(pidfile=str(tmp_path / "missing.pid"))),
        ProcessSource(target(unit=f"ile-absent-{uuid.uuid4().hex[:8]}")),
        ProcessSource(target(cmdline=rf"\bnothing-runs-this-{uuid.uuid4().hex}\b")),
        ProcessSource(target(base_url="http://127.0.0.1:1")),
    ]
    for source in sources:
        result = run_source("process", source.sample, target="llm")
        assert result.value is None
        assert result.status.up, result.status.error


@pytest.mark.integration
def test_a_pidfile_rewritten_or_removed_while_its_process_lives_is_followed_at_once(tmp_path):
    # The pidfile is only stat'ed while it stays as it was (issue 18): any change reads it.
    first, second = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        pidfile = tmp_path / "engine.pid"
        pidfile.write_text(f"{first.pid}\n")
        source = ProcessSource(target(pidfile=str(pidfile)))
        assert sample(source).pid == sample(source).pid == first.pid

        pidfile.write_text(f"{second.pid}\n")  # same size, maybe the same mtime tick
        os.utime(pidfile, ns=(1, 1))  # a rewrite that left no newer mtime
        moved = sample(source)
        pidfile.unlink()
        removed = source.sample()
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
    assert moved.pid == second.pid
    assert removed is None


@pytest.mark.integration
def test_pidfile_naming_an_ended_process_or_no_pid_is_absent(tmp_path, caplog):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead, garbage = tmp_path / "dead.pid", tmp_path / "garbage.pid"
    dead.write_text(f"{ended.pid}\n")
    garbage.write_text("not a pid\n")

    assert ProcessSource(target(pidfile=str(dead))).sample() is None
    garbage_source = ProcessSource(target(pidfile=str(garbage)))
    assert garbage_source.sample() is None
    assert garbage_source.sample() is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(garbage) in warnings[0].getMessage()


def test_unit_name_that_escapes_the_cgroup_tree_is_a_source_error():
    result = run_source("process", ProcessSource(target(unit="../../etc")).sample)
    assert not result.status.up
    assert result.status.error == "invalid_finder"


# --- systemd units through real cgroups ---------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("hierarchy", cgroup_hierarchies())
def test_unit_is_found_through_its_cgroup_in_system_slice(hierarchy, make_tree, cgroup_dir):
    assert hierarchy.startswith("/sys/fs/cgroup"), "units are looked up under /sys/fs/cgroup"
    unit = f"ile-test-{uuid.uuid4().hex[:8]}"
    group = cgroup_dir(Path(hierarchy) / "system.slice" / f"{unit}.service")
    tree = make_tree()
    (group / "cgroup.procs").write_text(str(tree.main_pid))
    workers = {tree.spawn(), tree.spawn(read=False)}  # forked inside the cgroup

    found = sample(ProcessSource(target(unit=unit)))  # default root, ".service" implied

    assert found.pid == tree.main_pid
    assert set(found.pids) == {tree.main_pid, *workers}
    assert tree.reaper.pid not in found.pids
    tree.close()


@pytest.mark.integration
def test_unit_in_a_nested_slice_with_a_delegated_subgroup(make_tree, cgroup_dir):
    hierarchies = cgroup_hierarchies()
    assert hierarchies, "no cgroup2 or name=systemd hierarchy mounted"
    root = Path(hierarchies[0]) / f"ile-test-{uuid.uuid4().hex[:8]}"
    unit = "llm@0.service"
    group = cgroup_dir(root / "ai.slice" / "ai-llm.slice" / unit)
    payload = cgroup_dir(group / "payload")  # as with Delegate=yes
    tree = make_tree()
    (group / "cgroup.procs").write_text(str(tree.main_pid))
    worker = tree.spawn()
    (payload / "cgroup.procs").write_text(str(worker))

    source = ProcessSource(target(unit=unit), cgroup_root=str(root))
    found = sample(source)
    tree.ask(f"kill {worker}")
    after = sample(source)
    tree.close()

    assert found.pid == tree.main_pid and set(found.pids) == {tree.main_pid, worker}
    assert found.read_bytes is not None and found.read_bytes >= DATA_BYTES
    assert after.pids == (tree.main_pid,)
    assert source.sample() is None  # the cgroup emptied: the unit stopped


# --- containers through their cgroup (a tmp dir stands in for /sys/fs/cgroup) -------------

POD = "8d2f4a6e-1b3c-4d5e-9f70-a1b2c3d4e5f6"
ENGINE_ID = "3b4f6c1d2e8a9f0b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b"
PAUSE_ID = "0f" * 32

# Where each runtime puts a container, below the cgroup root (the parser's table has more).
CONTAINER_DIRS = {
    "kubelet systemd driver, containerd": "kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{{id}}.scope",
    "kubelet cgroupfs driver, v1 memory only": f"memory/kubepods/pod{POD}/{{id}}",
    "plain Docker under systemd, hybrid layout": "unified/system.slice/docker-{id}.scope",
    "rootless Podman": "user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{id}.scope",
}


@pytest.mark.integration
@pytest.mark.parametrize("layout", CONTAINER_DIRS.values(), ids=CONTAINER_DIRS.keys())
def test_container_is_found_through_its_cgroup_beside_its_pods_other_containers(
    layout, make_tree, tmp_path
):
    engine, pause = make_tree(), make_tree()
    group = tmp_path / layout.format(id=ENGINE_ID)
    (group / "payload").mkdir(parents=True)  # a container's own subgroup (systemd inside)
    (group / "cgroup.procs").write_text(f"{engine.main_pid}\n")
    worker = engine.spawn()
    (group / "payload" / "cgroup.procs").write_text(f"{worker}\n")
    sibling = group.parent / layout.format(id=PAUSE_ID).rpartition("/")[2]
    sibling.mkdir()
    (sibling / "cgroup.procs").write_text(f"{pause.main_pid}\n")
    monitor = group.parent / f"libpod-conmon-{ENGINE_ID}.scope"  # the runtime's, not ours
    monitor.mkdir()
    (monitor / "cgroup.procs").write_text(f"{pause.main_pid}\n")

    found = sample(ProcessSource(target(container_id=ENGINE_ID), cgroup_root=str(tmp_path)))

    assert found.pid == engine.main_pid
    assert set(found.pids) == {engine.main_pid, worker}


@pytest.mark.integration
def test_container_by_short_id_until_its_cgroup_is_removed(make_tree, tmp_path):
    engine = make_tree()
    group = tmp_path / CONTAINER_DIRS["kubelet systemd driver, containerd"].format(id=ENGINE_ID)
    group.mkdir(parents=True)
    (group / "cgroup.procs").write_text(f"{engine.main_pid}\n")
    source = ProcessSource(target(container_id=ENGINE_ID[:12]), cgroup_root=str(tmp_path))

    assert sample(source).pid == engine.main_pid
    (group / "cgroup.procs").unlink()
    group.rmdir()  # the runtime removes the container's cgroup when it is deleted
    assert source.sample() is None


@pytest.mark.integration
def test_an_absent_container_is_looked_for_on_full_ticks_only(make_tree, tmp_path):
    engine = make_tree()
    group = tmp_path / CONTAINER_DIRS["kubelet systemd driver, containerd"].format(id=ENGINE_ID)
    source = ProcessSource(
        target(container_id=ENGINE_ID), cgroup_root=str(tmp_path), rescan_every=3
    )
    assert source.sample() is None  # tick 1: walked, nothing there
    group.mkdir(parents=True)
    (group / "cgroup.procs").write_text(f"{engine.main_pid}\n")
    assert source.sample() is None  # tick 2: no walk of every pod's cgroups for it
    assert sample(source).pid == engine.main_pid  # tick 3, a full one


# --- faults: zombies, reaped and reparented workers, vanishing and reused pids -------------


@pytest.mark.integration
def test_zombie_main_process_with_live_workers_still_sums_the_workers(make_tree, tmp_path):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    workers = {tree.spawn(), tree.spawn()}
    source = ProcessSource(target(pidfile=str(pidfile)))
    sample(source)

    tree.ask("exit 7")  # the reaper leaves it unreaped; the workers are reparented
    wait_for(lambda: proc_state(tree.main_pid) == "Z")
    zombie = sample(source)

    assert zombie.zombie and zombie.pid == tree.main_pid
    assert set(zombie.pids) == {tree.main_pid, *workers}
    assert zombie.read_bytes is not None and zombie.read_bytes >= 2 * DATA_BYTES
    assert zombie.rss_bytes > 0


@pytest.mark.integration
def test_reaped_worker_folds_into_its_parent_and_a_reparented_one_just_ends(make_tree, tmp_path):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    source = ProcessSource(target(pidfile=str(pidfile)))
    worker = tree.spawn()
    middle, grandchild = (int(w) for w in tree.ask("nest").split()[1:])
    full = sample(source)

    tree.ask(f"kill {worker}")  # the main process reaps it: its bytes fold into the main's
    reaped = sample(source)
    tree.ask(f"kill {middle}")  # the grandchild is reparented outside the tree, still counted
    orphaned = sample(source)
    os.kill(grandchild, signal.SIGKILL)  # reaped by the reaper: its bytes leave the tree
    wait_for(lambda: proc_state(grandchild) == "")
    ended = sample(source)

    assert {worker, middle, grandchild} <= set(full.pids)
    assert worker not in reaped.pids
    assert _bytes(reaped) >= _bytes(full)
    assert reaped.cpu_seconds >= full.cpu_seconds - 1e-6
    assert grandchild in orphaned.pids and middle not in orphaned.pids
    assert _bytes(orphaned) >= _bytes(reaped) - 1
    assert ended.pids == (tree.main_pid,)
    assert _bytes(ended) <= _bytes(orphaned) - DATA_BYTES  # a drop: the lifecycle sees a reset


def _bytes(s: ProcessSample) -> int:
    assert s.read_bytes is not None
    return s.read_bytes


@pytest.mark.integration
def test_processes_vanishing_mid_sample_never_escape(make_tree, tmp_path):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    tree.spawn(read=False)
    source = ProcessSource(target(pidfile=str(pidfile)), rescan_every=1)
    tree.ask("churn")  # a thread forks short-lived children as fast as it can
    try:
        samples = [source.sample() for _ in range(200)]
    finally:
        tree.ask("unchurn")

    assert all(s is not None and s.pid == tree.main_pid for s in samples)
    assert max(len(s.pids) for s in samples if s) > 2  # the short-lived ones were seen


def _spawn_at_pid(pid: int, data_file: Path) -> subprocess.Popen[str]:
    """Start a stranger process that gets exactly ``pid``, through ns_last_pid (root)."""
    # Start times tick at 10 ms (USER_HZ): a pid reused within one tick cannot be told apart,
    # by psutil or by anyone reading /proc. Real reuse takes a whole pid_max cycle.
    time.sleep(0.03)
    argv = [
        sys.executable,
        "-c",
        TREE_PROGRAM,
        "main",
        "stranger",
        json.dumps({"file": str(data_file)}),
    ]
    for _ in range(50):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()
        if proc.pid == pid:
            return proc
        _stop(proc)  # another process on the host took the pid first
    pytest.fail(f"could not obtain pid {pid}")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


@pytest.fixture
def strangers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        _stop(proc)


@pytest.mark.integration
def test_reused_main_pid_is_a_new_instance_without_the_old_tree(
    make_tree, tmp_path, data_file, strangers
):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    survivor = tree.spawn()  # outlives its main process
    source = ProcessSource(target(pidfile=str(pidfile)))
    old = sample(source)

    os.kill(tree.main_pid, signal.SIGKILL)
    wait_for(lambda: proc_state(tree.main_pid) == "")
    strangers.append(_spawn_at_pid(tree.main_pid, data_file))  # the stale pidfile names it
    new = sample(source)

    assert new.pid == old.pid and new.create_time != old.create_time
    assert new.pids == (tree.main_pid,) and survivor not in new.pids
    assert proc_state(survivor) not in ("", "Z")


@pytest.mark.integration
def test_reused_worker_pid_is_not_counted_in_the_tree(make_tree, tmp_path, data_file, strangers):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    worker = tree.spawn()
    source = ProcessSource(target(pidfile=str(pidfile)))
    before = sample(source)

    tree.ask(f"kill {worker}")
    stranger = _spawn_at_pid(worker, data_file)
    strangers.append(stranger)
    assert stranger.stdin is not None and stranger.stdout is not None
    stranger.stdin.write("read\n")
    stranger.stdin.flush()
    stranger.stdout.readline()  # the stranger read DATA_BYTES from disk
    after = sample(source)

    assert worker not in after.pids
    assert 0 <= _bytes(after) - _bytes(before) < DATA_BYTES


# --- permissions: another user's target, hidepid (RELIABILITY 43, 48) ----------------------


def _sampler_program() -> None:
    """Runs in a child: build a ProcessSource as root, drop to nobody, print one sample."""
    import codecs
    import dataclasses
    import json
    import os
    import sys

    from exporter.base.errors import SourceError
    from exporter.config import Target
    from exporter.sources.process import ProcessSource

    finder = json.loads(sys.stdin.read())
    target = Target("llm", "vllm", finder.pop("base_url", "http://127.0.0.1:1"), "/health", 1.0)
    source = ProcessSource(dataclasses.replace(target, **finder))
    codecs.lookup("ascii")  # nobody cannot import codecs from root's interpreter later
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)  # every capability goes with uid 0, CAP_SYS_PTRACE included
    try:
        found = source.sample()
        print(json.dumps({"sample": dataclasses.asdict(found) if found else None}))
    except SourceError as exc:
        print(json.dumps({"error": exc.reason}))


SAMPLER = inspect.getsource(_sampler_program) + "\n_sampler_program()\n"
HIDEPID = 'mount -t proc -o hidepid=invisible proc /proc && exec "$0" "$@"'


def _sample_as_nobody(finder: dict[str, str], *, hidepid: bool = False) -> dict[str, object]:
    """Sample from a child that runs as nobody (so without CAP_SYS_PTRACE).

    Root here can read every /proc/PID/io, so a real EACCES needs another user: the sampler
    drops to nobody while the fake engine runs as daemon. With ``hidepid`` the child also
    mounts its own /proc with hidepid=invisible (what systemd's ProtectProc=invisible does).
    """
    argv = [sys.executable, "-c", SAMPLER]
    if hidepid:
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDEPID, *argv]
    done = subprocess.run(
        argv,
        input=json.dumps(finder),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory nobody can read (pytest's tmp_path is private to root)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        os.chmod(name, 0o755)
        yield Path(name)


@pytest.mark.integration
def test_other_users_target_reports_rss_and_cpu_but_read_bytes_permission_denied(make_tree):
    tree: Tree = make_tree(uid=DAEMON)
    worker = tree.spawn()

    result = _sample_as_nobody({"cmdline": tree.regex})

    found = result["sample"]
    assert isinstance(found, dict), result
    assert found["pid"] == tree.main_pid and worker in found["pids"]
    assert found["read_bytes"] is None  # unknown, never a fake 0
    assert found["read_bytes_error"] == "permission_denied"
    assert found["rss_bytes"] > 0 and found["cpu_seconds"] > 0


@pytest.mark.integration
def test_other_users_listener_without_ptrace_is_permission_denied(make_tree):
    tree: Tree = make_tree(uid=DAEMON)
    port = int(tree.ask("listen").split()[1])

    result = _sample_as_nobody({"base_url": f"http://127.0.0.1:{port}"})

    assert result == {"error": "permission_denied"}


@pytest.mark.integration
@pytest.mark.parametrize("how", ["cmdline", "pidfile"])
def test_proc_mounted_hidepid_invisible_reports_not_visible(how, make_tree, shared_dir):
    pidfile = shared_dir / "engine.pid"
    tree: Tree = make_tree(uid=DAEMON, pidfile=str(pidfile))
    finder = {"cmdline": tree.regex} if how == "cmdline" else {"pidfile": str(pidfile)}

    visible = _sample_as_nobody(finder)
    hidden = _sample_as_nobody(finder, hidepid=True)

    assert isinstance(visible["sample"], dict)
    assert hidden == {"error": "not_visible"}


@pytest.mark.integration
def test_sampling_cost_stays_small_for_a_known_tree(make_tree, tmp_path):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    for _ in range(4):
        tree.spawn(read=False)
    source = ProcessSource(target(pidfile=str(pidfile)))
    sample(source)
    started = time.perf_counter()
    for _ in range(20):
        sample(source)
    per_tick = (time.perf_counter() - started) / 20
    assert per_tick < 0.25  # generous: a tick is 1 s and other sources share it


@pytest.mark.integration
def test_default_finder_sees_an_engine_that_does_not_listen_yet(tmp_path):
    """vLLM/SGLang refuse connections for the whole load: the port has no listener, but the
    engine's command line names the engine and the port."""
    port = 30000 + os.getpid() % 20000
    loading = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "-m",
            "sglang.launch_server",
            "--port",
            str(port),
        ]
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "sglang", "--port", str(port) + "1"]
    )
    try:
        target = Target(
            name="t",
            engine="sglang",
            base_url=f"http://127.0.0.1:{port}",
            health_path="/health",
            probe_timeout_seconds=0.5,
        )
        deadline = time.monotonic() + 5
        sample = None
        while sample is None and time.monotonic() < deadline:
            sample = ProcessSource(target).sample()
        assert sample is not None and sample.pid == loading.pid
        generic = Target(
            name="g",
            engine="openai",
            base_url=f"http://127.0.0.1:{port}",
            health_path="/health",
            probe_timeout_seconds=0.5,
        )
        assert ProcessSource(generic).sample() is None  # no engine words: port only
    finally:
        for p in (loading, other):
            p.kill()
            p.wait()


# --- cost: new children between full rescans, trees beyond the descriptor budget ------------


@pytest.mark.integration
def test_a_child_forked_by_another_thread_joins_before_the_next_full_rescan(make_tree, tmp_path):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    source = ProcessSource(target(pidfile=str(pidfile)), rescan_every=1000)
    sample(source)  # adopted; no full rescan for the next 999 samples
    tree.ask("churn")  # a non-main thread forks children: absent from the main's children file
    try:
        seen = []
        for _ in range(50):
            seen.append(len(sample(source).pids))
            time.sleep(0.01)
    finally:
        tree.ask("unchurn")

    assert max(seen) > 1  # found among the pids allocated since the previous sample


BUDGET_SAMPLER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from exporter.config import Target
from exporter.sources.process import ProcessSource
target = Target("llm", "vllm", "http://127.0.0.1:1", "/health", 1.0, pidfile=sys.argv[1])
source = ProcessSource(target)
samples = [source.sample() for _ in range(3)]
print(json.dumps([len(s.pids) for s in samples]))
"""


@pytest.mark.integration
def test_a_tree_larger_than_the_descriptor_budget_is_still_summed_whole(make_tree, tmp_path):
    pidfile = tmp_path / "engine.pid"
    tree = make_tree(pidfile=str(pidfile))
    for _ in range(20):  # 21 processes, 42 files: more than a 64-descriptor process may keep
        tree.spawn(read=False)
    done = subprocess.run(
        [sys.executable, "-c", BUDGET_SAMPLER, str(pidfile)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [21, 21, 21]


WIDE_PARENT = r"""
import os, signal, sys, time
n, pidfile, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
children = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            time.sleep(3600)
    children.append(pid)
with open(pidfile, "w") as f:
    f.write(str(os.getpid()))
open(ready, "w").close()
time.sleep(120)
"""


@pytest.mark.integration
def test_a_tree_of_two_thousand_processes_is_counted_whole(tmp_path):
    # The kernel hands a children list out a page at a time: one read saw about 820 of 2,000.
    pidfile, ready = tmp_path / "engine.pid", tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", WIDE_PARENT, "2000", str(pidfile), str(ready)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the parent did not fork its children in time"
        found = sample(ProcessSource(target(pidfile=str(pidfile))))
        assert found.process_count == 2001
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _read_calls(work: Callable[[], object]) -> int:
    """Read syscalls this process made during ``work`` (``syscr`` of /proc/self/io)."""

    def syscr() -> int:
        with open("/proc/self/io", "rb") as f:
            return int(f.read().split(b"syscr: ")[1].split()[0])

    before = syscr()
    work()
    return syscr() - before


@dataclass
class Resting:
    """A fake engine with idle workers whose source the daemon has said is at rest."""

    tree: Tree
    source: ProcessSource
    starting: int  # read calls of ten samples before it was at rest
    at_rest: int  # and of ten samples after


@pytest.fixture
def resting(make_tree, tmp_path, monkeypatch) -> Callable[[int], Resting]:
    """Make a ``Resting`` of N workers; a quiet worker is re-read after a minute only."""
    monkeypatch.setattr(process_source, "QUIET_REREAD_SECONDS", 60.0)

    def make(workers: int) -> Resting:
        pidfile = tmp_path / f"engine-{uuid.uuid4().hex[:8]}.pid"
        tree = make_tree(pidfile=str(pidfile))
        spawned = [tree.spawn(read=False) for _ in range(workers)]
        source = ProcessSource(target(pidfile=str(pidfile)))
        wait_for(lambda: len(sample(source).pids) == workers + 1)
        starting = _read_calls(lambda: [sample(source) for _ in range(10)])
        seen_at_rest(source)  # the daemon says so once the server is ready
        sample(source)  # every quiet worker read once more, the next time in part of a minute
        at_rest = _read_calls(lambda: [sample(source) for _ in range(10)])
        assert sorted(spawned) == _workers(sample(source))
        return Resting(tree, source, starting, at_rest)

    return make


def _workers(found: ProcessSample) -> list[int]:
    """The tree's pids but the main process's, sorted."""
    return sorted(found.pids[1:])


@pytest.mark.integration
def test_a_tree_at_rest_rereads_quiet_workers_seldom_and_sees_them_end_at_once(resting):
    rest = resting(20)
    source, tree = rest.source, rest.tree
    workers = _workers(sample(source))

    before = sample(source)
    tree.ask("read")  # the main process is read every tick: its reads show at once
    after = sample(source)
    tree.ask(f"kill {workers[0]}")  # killed and reaped before the reply

    assert rest.at_rest * 4 < rest.starting
    assert _bytes(after) - _bytes(before) >= DATA_BYTES
    assert workers[0] not in sample(source).pids  # the next tick, not in a minute
    assert len(sample(source).pids) == 20


@pytest.mark.integration
def test_a_quiet_worker_that_dies_unreaped_counts_as_a_zombie_until_reaped(resting):
    rest = resting(4)
    source, tree = rest.source, rest.tree
    victim = _workers(sample(source))[-1]
    rss_before = sample(source).rss_bytes

    tree.ask(f"kill {victim} nowait")
    wait_for(lambda: proc_state(victim) == "Z")
    as_zombie = sample(source)
    tree.ask(f"reap {victim}")
    reaped = sample(source)

    assert victim in as_zombie.pids  # as a tree read every tick counted it
    assert as_zombie.rss_bytes < rss_before  # its memory is no longer counted
    assert victim not in reaped.pids
    assert len(reaped.pids) == 4


@pytest.mark.integration
def test_a_tree_at_rest_without_pidfds_reads_every_worker_every_tick(resting, monkeypatch):
    # A fake pidfd_open that refuses, as an older container runtime's seccomp profile does:
    # no seccomp filter can be installed from here.
    def refused(pid: int) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(exits, "_PIDFD_OPEN", refused)
    rest = resting(20)
    victim = _workers(sample(rest.source))[0]
    rest.tree.ask(f"kill {victim}")

    assert rest.at_rest * 2 > rest.starting  # not the saving: no quiet worker was watched
    assert victim not in sample(rest.source).pids


@pytest.mark.integration
def test_a_tree_at_rest_gives_its_pidfds_back(resting):
    rest = resting(10)
    pids = set(sample(rest.source).pids)
    seen_at_rest(rest.source, False)  # a restart: the tree is the progress signal again
    sample(rest.source)
    after_rest = _descriptors_on(pids)
    seen_at_rest(rest.source)
    sample(rest.source)
    rest.source.close()

    assert after_rest == {"proc": 2 * 11}  # stat and io kept, no pidfd left
    assert _descriptors_on(pids) == {}


def _descriptors_on(pids: set[int]) -> dict[str, int]:
    """This process's descriptors on the tree's /proc files, and its pidfds, by kind.

    Only these: other tests' descriptors are closed whenever the collector gets to them.
    """
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, gone
        kind = "pidfd" if link == "anon_inode:[pidfd]" and _pidfd_pid(fd) in pids else None
        if any(link.startswith(f"/proc/{pid}/") for pid in pids):
            kind = "proc"
        if kind is not None:
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _pidfd_pid(fd: str) -> int | None:
    """The process a pidfd refers to (its ``fdinfo`` names it), or None."""
    try:
        info = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return None
    pid = next((line.split()[1] for line in info.splitlines() if line.startswith("Pid:")), None)
    return int(pid) if pid is not None else None
