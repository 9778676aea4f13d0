"""The dependency rules of STYLE.md section 1, checked by parsing every module's imports."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "exporter"
TOOLING = PACKAGE.parent / "exporter_tooling"


def modules_of(package: Path) -> dict[str, Path]:
    return {
        ".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in package.rglob("*.py")
    }


MODULES = modules_of(PACKAGE)
TOOLING_MODULES = modules_of(TOOLING)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def importers_of(prefix: str) -> set[str]:
    return {
        m
        for m, p in MODULES.items()
        if any(i == prefix or i.startswith(prefix + ".") for i in imports_of(p))
    }


STDLIB = set(sys.stdlib_module_names)


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        *(
            (
                m,
                {
                    "exporter.base",
                    "exporter.core.failure",  # the reason detail; never the classifier
                    "exporter.core.lifecycle",
                    "exporter.engines",
                },
            )
            for m in MODULES
            if m == "exporter.core.lifecycle" or m.startswith("exporter.core.lifecycle.")
        ),
        *(
            (
                m,
                {
                    "exporter.base",
                    "exporter.core.lifecycle",
                    "exporter.core.snapshot",
                    "exporter.core.gpuhealth",
                    "exporter.render.bounds",
                    "exporter.render.metrics",
                    "prometheus_client",
                },
            )
            for m in MODULES
            if m == "exporter.render.metrics" or m.startswith("exporter.render.metrics.")
        ),
        ("exporter.base", set()),
        # The probes' HTTP client is a leaf: URLs, sockets and deadlines, nothing of engines.
        ("exporter.sources.probe.wire", {"httptools"}),
        (
            "exporter.sources.probe.client",
            {"exporter.base", "exporter.sources.probe.wire", "httpx"},
        ),
        ("exporter.sources.probe.answers", {"exporter.base", "exporter.sources.probe.client"}),
        ("exporter.core.gpuhealth", {"exporter.base"}),
        (
            "exporter.core.snapshot",
            {
                "exporter.base",
                "exporter.core.advice",
                "exporter.core.bounds",
                "exporter.core.lifecycle",
                "exporter.core.trail",
            },
        ),
        ("exporter.core.trail", {"exporter.base", "exporter.core.lifecycle"}),
        ("exporter.core.bounds", {"exporter.base", "exporter.core.lifecycle", "exporter.engines"}),
        # The one core entry the loop calls: the core and what it stands on, nothing more.
        ("exporter.core.tick", {"exporter.base", "exporter.core", "exporter.engines"}),
    ],
)
def test_pure_modules_import_only_what_they_may(module, allowed):
    bad = {
        i
        for i in imports_of(MODULES[module])
        if i.split(".")[0] not in STDLIB
        and not any(i == a or i.startswith(a + ".") for a in allowed)
    }
    assert not bad, f"{module} imports {sorted(bad)}"


@pytest.mark.parametrize(
    ("library", "owners"),
    [
        ("pynvml", {"exporter.sources.gpu.source", "exporter.sources.gpu.nvidia.worker"}),
        ("systemd", {"exporter.sources.journal"}),
        # config only parses base URLs with httpx.URL (no I/O), exactly as the probes will
        (
            "httpx",
            {
                "exporter.sources.probe.client",
                "exporter.commands.client",
                "exporter.config.fields",
                "exporter.discovery.kubernetes",
                "exporter.discovery.docker",
                "exporter.discovery.watch",  # the streams both discovery clients read
            },
        ),
        (
            "psutil",
            {
                "exporter.sources.process.finding",
                "exporter.sources.process.tree",
                "exporter.sources.disk",
            },
        ),
    ],
)
def test_each_io_library_lives_in_its_one_module(library, owners):
    assert importers_of(library) <= owners


def test_the_core_imports_only_the_core_and_the_engine_profiles():
    core = [m for m in MODULES if m.startswith("exporter.core")]
    bad = {
        (m, i)
        for m in core
        for i in imports_of(MODULES[m])
        if i.split(".")[0] not in STDLIB
        and not i.startswith(("exporter.base", "exporter.core", "exporter.engines"))
        and i != "re2"  # a linear-time regex engine: the classifier's screens, no I/O
    }
    assert core and not bad, f"the core does I/O through {sorted(bad)}"


def test_the_ground_floor_imports_nothing_above_it():
    # Every layer stands on exporter.base; it borrows from none of them. Besides the standard
    # library it may use RE2, a linear-time regex engine with no I/O (base/linear's screens).
    floor = [m for m in MODULES if m.startswith("exporter.base")]
    bad = {
        (m, i)
        for m in floor
        for i in imports_of(MODULES[m])
        if i.split(".")[0] not in {*STDLIB, "re2"} and not i.startswith("exporter.base")
    }
    assert floor and not bad, f"the floor imports {sorted(bad)}"


def test_sources_import_from_the_core_nothing():
    # Sources stand on the floor (exporter.base), config and their one I/O library; the
    # core interprets their readings (Xid labels, flood screens), never the other way.
    sources = [m for m in MODULES if m.startswith("exporter.sources")]
    bad = {
        (m, i)
        for m in sources
        for i in imports_of(MODULES[m])
        if i == "exporter.core" or i.startswith("exporter.core.")
    }
    assert sources and not bad, f"sources import the core: {sorted(bad)}"


def test_only_the_shell_imports_sources():
    users = {
        m
        for m in importers_of("exporter.sources")
        if not m.startswith(("exporter.sources", "exporter.daemon."))  # the loop's package
    }
    assert users <= {
        "exporter.daemon",
        "exporter.discovery.watch",  # the probes' socket watchdog
        "exporter.cli",
        "exporter.commands.wait_standalone",
        "exporter.commands.replay",
    }


def test_the_product_never_imports_its_tooling():
    # Not even by name: the tooling has its own entry point (python -m exporter_tooling).
    users = importers_of("exporter_tooling")
    assert not users, f"{sorted(users)} import exporter_tooling"


def test_the_product_names_no_tooling_and_the_wheel_ships_none():
    named = [m for m, p in MODULES.items() if "exporter_tooling" in p.read_text()]
    assert not named, f"{named} name the tooling"
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not [p for p in shipped if p.startswith("exporter_tooling")]
    assert "exporter_tooling" not in pyproject["tool"]["setuptools"]["package-data"]


def test_the_product_ships_no_c_source():
    assert not list(PACKAGE.rglob("*.c"))


@pytest.mark.parametrize("part", ["exporter_tooling.simulate", "exporter_tooling.fakenvml"])
def test_the_simulator_and_fake_nvml_never_import_the_product(part):
    # They are what the exporter watches, not the watcher: nothing of the product in them.
    bad = {
        m: sorted(i for i in imports_of(p) if i == "exporter" or i.startswith("exporter."))
        for m, p in TOOLING_MODULES.items()
        if m == part or m.startswith(part + ".")
    }
    assert not {m: i for m, i in bad.items() if i}


def test_importing_the_package_has_no_side_effects():
    code = (
        "import logging, prometheus_client as pc, exporter, exporter.cli, exporter.render.metrics,"
        " exporter.core.lifecycle, exporter.daemon\n"
        "names = [m for m in pc.REGISTRY._names_to_collectors if m.startswith('inference_')]\n"
        "assert not names, names\n"
        "assert not logging.getLogger().handlers\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


@pytest.mark.parametrize("module", ["exporter.discovery.pods", "exporter.discovery.containers"])
def test_discovery_does_io_only_in_its_client(module):
    pure = imports_of(MODULES[module])
    assert {i for i in pure if i.split(".")[0] not in STDLIB} <= {
        "exporter.config",
        "exporter.engines",
        "exporter.discovery.pods",
    }


def test_the_daemon_leaves_optional_native_libraries_until_a_target_needs_them():
    # systemd-python's libraries cost about 2.6 MiB of RSS (issue 18): a daemon that reads
    # only log files never loads them; the discovery clients come with discovery.
    code = (
        "import sys, exporter.cli, exporter.daemon, exporter.web.app, exporter.web.transport\n"
        "lazy = ('systemd', 'exporter.discovery.')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(lazy))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)
