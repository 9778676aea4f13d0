"""Config loading: the example is valid, and each bad file gives exactly its one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.base.errors import ConfigErrors
from exporter.config import load_settings, parse_duration

ROOT = Path(__file__).resolve().parents[1]
BAD = sorted((ROOT / "tests/fixtures/config/bad").glob("*.toml"))


def expected_message(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    return first.removeprefix("# expect: ")


def exporter_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    )


def check_config(config: Path) -> subprocess.CompletedProcess[str]:
    return exporter_cli("check-config", "--config.file", str(config))


def in_bare_environment(command: str, config: Path) -> subprocess.CompletedProcess[str]:
    """``command`` on ``config`` with no Kubernetes variables (as outside a cluster)."""
    return subprocess.run(
        [sys.executable, "-m", "exporter", command, "--config.file", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_example_config_is_valid_and_complete():
    settings = load_settings(ROOT / "deploy/config.example.toml")
    names = [t.name for t in settings.targets]
    assert names == ["kimi-k2", "llama"]
    kimi = settings.targets[0]
    assert kimi.journal and kimi.unit == "sglang.service"
    assert kimi.completion is not None and kimi.completion.interval_seconds == 30
    assert kimi.stall.initializing == 1200
    assert kimi.probe_timeout_seconds == pytest.approx(0.8)
    assert settings.targets[1].health_path == "/health"


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_each_bad_file_gives_its_one_line_error(path):
    with pytest.raises(ConfigErrors) as info:
        load_settings(path)
    lines = [str(e) for e in info.value.errors]
    # the message names the file, the field and the reason; the line is parsed with
    # the "# expect:" line skipped, so TOML line numbers count from the file's top
    assert lines == [f"{path}: {expected_message(path)}"]


def test_all_problems_are_reported_at_once():
    text = '[[target]]\nname = "a b"\nbase_url = "ftp://x"\nbogus = 1\n'
    import tomllib

    from exporter.config import parse_settings

    with pytest.raises(ConfigErrors) as info:
        parse_settings(tomllib.loads(text), "c.toml")
    assert [e.field for e in info.value.errors] == [
        "target[0].name",
        "target[0].base_url",
        "target[0].bogus",
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        (15, 15.0),
        (0.25, 0.25),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "fast", "-1s", True, -3])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.integration
def test_check_config_command_exits_2_with_one_line_per_problem(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('[[target]]\nname = "a"\nbase_url = "ftp://x"\n[exporter]\ninterval = "x"\n')
    run = exporter_cli("check-config", "--config.file", str(bad))
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"{bad}: exporter.interval: 'x' is not a duration such as 10s or 1m30s",
        f"{bad}: target[0].base_url: scheme must be http or https",
    ]
    good = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "check-config",
            "--config.file",
            str(ROOT / "deploy/config.example.toml"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert good.returncode == 0, good.stderr


toml_scalars = st.one_of(
    st.text(max_size=20), st.integers(), st.floats(allow_nan=False), st.booleans()
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
keys = st.one_of(
    st.text(max_size=5),
    st.sampled_from(
        [
            "name",
            "engine",
            "base_url",
            "health_path",
            "probe_timeout",
            "unit",
            "pidfile",
            "cmdline",
            "gpus",
            "completion",
            "stall",
            "log",
            "journal",
            "interval",
            "state_directory",
            "target",
            "exporter",
            "bogus",
        ]
    ),
)
tables = st.dictionaries(keys, toml_values, max_size=8)


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={"exporter": tables, "target": st.lists(tables, max_size=3), "extra": toml_values},
    )
)
def test_fuzzed_configs_give_settings_or_config_errors_never_a_crash(data):
    from exporter.config import Settings, parse_settings

    try:
        assert isinstance(parse_settings(data, "fuzz.toml"), Settings)
    except ConfigErrors as exc:
        assert exc.errors
        for err in exc.errors:
            line = str(err)
            assert line.startswith("fuzz.toml: ") and "\n" not in line


@pytest.mark.integration
def test_check_config_accepts_gpu_indices_gpu_uuids_and_mig_uuids(tmp_path):
    # As `nvidia-smi -L` prints them: R470+ MIG UUIDs, and the MIG-GPU-<uuid>/gi/ci of R450.
    gpus = [
        0,
        "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f",
        "MIG-4b4c9a1e-6b0b-5e33-9c1f-3a5f0e2d7c11",
        "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0",
    ]
    config = tmp_path / "c.toml"
    listed = ", ".join(f'"{g}"' if isinstance(g, str) else str(g) for g in gpus)
    config.write_text(
        f'[[target]]\nname = "a"\nbase_url = "http://127.0.0.1:1"\ngpus = [{listed}]\n'
    )

    run = check_config(config)

    assert run.returncode == 0, run.stderr
    assert load_settings(config).targets[0].gpus == tuple(gpus)


@pytest.mark.integration
def test_check_config_also_checks_key_files_and_the_web_config(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-secret\n")
    key.chmod(0o644)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[[target]]\nname = "a"\nbase_url = "http://127.0.0.1:1"\napi_key_file = "{key}"\n'
    )
    web = tmp_path / "web.yml"
    web.write_text("tls_config: {}\n")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "check-config",
            "--config.file",
            str(cfg),
            "--web.config.file",
            str(web),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 2
    lines = run.stderr.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{key}: api_key_file: is readable by other users")
    assert lines[1] == f"{web}: tls_config: unknown key"
    assert "sk-secret" not in run.stderr


@pytest.mark.parametrize(
    ("web_yml", "problem"),
    [
        ("tls_server_config:\n  cert_file: /nonexistent\n", "tls_server_config.key_file"),
        ("basic_auth_users: [1, 2\n", "invalid YAML"),
    ],
)
@pytest.mark.parametrize("command", ["run", "check-config"])
def test_run_refuses_a_bad_web_config_exactly_as_check_config_does(
    tmp_path, command, web_yml, problem
):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[exporter]\nstate_directory = "{tmp_path / "state"}"\n'
        '[[target]]\nname = "a"\nbase_url = "http://127.0.0.1:1"\n'
    )
    web = tmp_path / "web.yml"
    web.write_text(web_yml)
    done = subprocess.run(
        [sys.executable, "-m", "exporter", command, "--config.file", str(cfg)]
        + ["--web.config.file", str(web), "--web.listen-address", "127.0.0.1:0"]
        * (command == "run")
        + ["--web.config.file", str(web)] * (command == "check-config"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith(f"{web}: ") and problem in line


# --- what run needs, checked here (issue 19 #2, #12) ---------------------------------------

url_tails = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24).map(
    lambda s: "http://" + s
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(url_tails, st.sampled_from(["http://xn--a", "http://[::1]x:80", "http://😀"])))
def test_every_base_url_the_checker_accepts_builds_the_probe_client(url):
    """The daemon died at start or SIGHUP on URLs urllib liked and httpx refused (a \\t)."""
    from exporter.config import parse_settings
    from exporter.sources.probe import Prober

    data = {"target": [{"name": "a", "base_url": url}]}
    try:
        (target,) = parse_settings(data, "c.toml").targets
    except ConfigErrors as exc:
        assert all("\n" not in str(e) for e in exc.errors)
        return
    Prober(target).close()  # parses the URL and the health path as its probes will


@pytest.mark.integration
def test_run_refuses_a_url_the_http_client_would_refuse_with_one_line(tmp_path):
    # A TOML escape: the string holds a real tab. urllib took it, httpx raised InvalidURL
    # when the daemon built its probes: a traceback and exit 1.
    config = tmp_path / "c.toml"
    config.write_text(
        f'[exporter]\nstate_directory = "{tmp_path}"\n'
        '[[target]]\nname = "a"\nbase_url = "http://127.0.0.1:8000\\t"\n'
    )
    for command in ("run", "check-config"):
        result = exporter_cli(command, "--config.file", str(config))
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"{config}: target[0].base_url: must not contain control characters "
            "('\\t' at position 21)"
        ]


@pytest.mark.integration
def test_check_config_refuses_a_state_directory_the_daemon_could_not_write(tmp_path):
    # Root passes any permission check, so the unwritable places are real ones: a path
    # below a regular file, and a regular file where the directory should be.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = {
        blocker / "state": f"cannot be created: {blocker} is not a directory",
        blocker: "exists and is not a directory",
    }
    for state, reason in cases.items():
        config = tmp_path / "c.toml"
        config.write_text(f'[exporter]\nstate_directory = "{state}"\n')
        result = check_config(config)
        assert result.returncode == 2
        assert result.stderr.splitlines() == [f"{config}: exporter.state_directory: {reason}"]
    config.write_text(f'[exporter]\nstate_directory = "{tmp_path / "new" / "state"}"\n')
    assert check_config(config).returncode == 0
    assert not (tmp_path / "new").exists(), "the check creates nothing"


def test_the_state_directory_is_probed_by_a_real_write(tmp_path, monkeypatch):
    from exporter.config import state_directory_problem

    assert state_directory_problem(str(tmp_path)) is None
    assert list(tmp_path.iterdir()) == [], "the probe file is removed"

    # A read-only mount refuses root too; one cannot be made here, so the write itself is
    # made to fail the way it would there (the one fake in this file).
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("tempfile.TemporaryFile", refuse)
    assert state_directory_problem(str(tmp_path)) == "is not writable: Read-only file system"


@pytest.mark.parametrize(
    "pattern",
    [r"(fail)\1", r"(?=x)oom", r"(?<!ok )error", r"a++", r"(?>a|ab)c"],
)
def test_patterns_only_a_backtracking_engine_can_run_are_refused(pattern):
    from exporter.config import parse_settings

    data = {"target": [{"name": "a", "base_url": "http://h:1", "log": {"markers": [pattern]}}]}
    with pytest.raises(ConfigErrors) as info:
        parse_settings(data, "c.toml")
    (line,) = (str(e) for e in info.value.errors)
    assert line.startswith("c.toml: target[0].log.markers[0]: needs backtracking")


def test_user_patterns_are_compiled_for_linear_time_matching():
    from exporter.config import UserRegex, parse_settings

    data = {
        "target": [
            {
                "name": "a",
                "base_url": "http://h:1",
                "cmdline": "(x+x+)+y",
                "log": {"fatal": ["(a+)+$"]},
            }
        ]
    }
    (target,) = parse_settings(data, "c.toml").targets
    (fatal,) = target.log_patterns.fatal
    assert fatal == UserRegex("(a+)+$", ignore_case=True)
    hostile = "a" * 5000 + "!"
    assert fatal.search(hostile) is None  # Python's re takes longer than anyone waits
    assert fatal.search("A" * 5000) is not None
    assert UserRegex(target.cmdline or "").search("x" * 5000) is None


def test_docker_discovery_defaults_to_the_docker_socket_and_podman_is_a_path_away():
    from exporter.config import DockerDiscovery, parse_settings

    default = parse_settings({"discovery": {"docker": {}}}, "c.toml").docker
    assert default == DockerDiscovery(socket="/var/run/docker.sock", name_template="{container}")
    podman = {"socket": "/run/podman/podman.sock", "name_template": "{project}/{service}"}
    d = parse_settings({"discovery": {"docker": {**podman, "grace": "90s"}}}, "c.toml").docker
    assert d is not None and (d.socket, d.name_template, d.grace_seconds) == (
        "/run/podman/podman.sock",
        "{project}/{service}",
        90.0,
    )
    off = {"discovery": {"docker": {"enabled": False}}}
    assert parse_settings(off, "c.toml").docker is None


def test_kubernetes_discovery_takes_the_node_from_node_name_as_the_downward_api_sets_it():
    from exporter.config import PodSelection, parse_settings

    data = {"discovery": {"kubernetes": {"grace": "2m"}}}
    k = parse_settings(data, "c.toml", environ={"NODE_NAME": "gpu-node-7"}).kubernetes
    assert k is not None and (k.node_name, k.grace_seconds, k.select) == (
        "gpu-node-7",
        120.0,
        PodSelection.ANNOTATED,
    )
    assert k.name_template == "{namespace}/{pod}" and k.kubeconfig is None
    off = {"discovery": {"kubernetes": {"enabled": False}}}
    assert parse_settings(off, "c.toml", environ={}).kubernetes is None
    with pytest.raises(ConfigErrors) as info:
        parse_settings(data, "c.toml", environ={})
    assert [str(e) for e in info.value.errors] == [
        "c.toml: discovery.kubernetes.node_name: is required (or set the NODE_NAME environment "
        "variable)"
    ]


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_run_and_check_config_refuse_discovery_without_credentials(tmp_path, command):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[discovery.kubernetes]\nnode_name = "gpu-node-7"\n')
    proc = in_bare_environment(command, cfg)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{cfg}: discovery.kubernetes.kubeconfig: is required outside a cluster "
        "(KUBERNETES_SERVICE_HOST unset)"
    ]


def test_check_config_says_discovery_is_on_and_for_which_node(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[discovery.kubernetes]\nnode_name = "gpu-node-7"\nkubeconfig = "{kubeconfig}"\n'
    )
    run = check_config(cfg)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{cfg}: OK (0 targets, pods of node gpu-node-7)"


@pytest.mark.parametrize(("count", "says"), [(1, "1 target"), (2, "2 targets")])
def test_check_config_counts_targets_in_english(tmp_path, count, says):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "".join(
            f'[[target]]\nname = "t{i}"\nengine = "vllm"\nbase_url = "http://127.0.0.1:{8000 + i}"'
            "\n"
            for i in range(count)
        )
    )
    run = check_config(cfg)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{cfg}: OK ({says})"


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_run_and_check_config_refuse_a_docker_socket_that_is_a_plain_file(tmp_path, command):
    not_a_socket = tmp_path / "docker.sock"
    not_a_socket.write_text("")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[discovery.docker]\nsocket = "{not_a_socket}"\n')
    proc = in_bare_environment(command, cfg)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"{cfg}: discovery.docker.socket: is not a unix socket"]


def test_check_config_says_which_docker_socket_and_warns_when_none_is_there(tmp_path):
    import socket

    path = tmp_path / "docker.sock"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[discovery.docker]\nsocket = "{path}"\n')
    missing = check_config(cfg)
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"{cfg}: discovery.docker.socket: does not exist (is the Docker daemon running?)"
    ]
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        ok = check_config(cfg)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"{cfg}: OK (0 targets, containers on {path})"


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_a_name_template_with_a_format_spec_is_refused_by_run_as_by_check_config(tmp_path, command):
    """Before: ``{pod:>30000000}`` passed check-config, then ``run`` grew to 3.9 GB."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[exporter]\nstate_directory = "{tmp_path / "state"}"\n'
        '[discovery.kubernetes]\nnode_name = "n1"\nname_template = "{namespace}/{pod:>30000000}"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "exporter", command, "--config.file", str(cfg)]
        + ["--web.listen-address", "127.0.0.1:0"] * (command == "run"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{cfg}: discovery.kubernetes.name_template: "
        "placeholder {pod} takes no format spec or conversion"
    ]
