"""The integration tests' fixtures: the simulated NVML library, built once; one headless
Chromium a module, a blank page a test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver

from exporter_tooling.fakenvml import build_simulated_nvml
from tests.integration.browser import chromium


@pytest.fixture(scope="session")
def nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the simulated libnvidia-ml.so.1 (``exporter_tooling.fakenvml``)."""
    return build_simulated_nvml(tmp_path_factory.mktemp("nvml")).parent


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """A headless Chromium shared by the tests of one module."""
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


@pytest.fixture
def page(browser: webdriver.Chrome) -> Iterator[webdriver.Chrome]:
    """The shared browser on a blank page, its console emptied of earlier tests' messages."""
    browser.get("about:blank")
    browser.get_log("browser")
    yield browser
    browser.get("about:blank")  # stop polling before the test's servers go away
