"""Config loading: the example is valid, and each bad file gives exactly its one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.config import load_settings, parse_duration
from exporter.errors import ConfigErrors

ROOT = Path(__file__).resolve().parents[1]
BAD = sorted((ROOT / "tests/fixtures/config/bad").glob("*.toml"))


def expected_message(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    return first.removeprefix("# expect: ")


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
    run = subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", "--config.file", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
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
