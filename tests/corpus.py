"""Where the shared corpus of real engine logs is, and its README's expected verdicts.

The corpus lives beside the project (``../shared/fixtures/logs``) or at
``$INFERENCE_LOG_CORPUS``. A clone without it skips the modules that read it, all with one
summary line (the skip is raised here, so pytest folds them); under ``CI=true`` its absence
fails the run instead, so a CI job can never pass by skipping them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "logs"
_ROW = re.compile(r"^\| `(?P<file>[\w.-]+\.log)` \| (?P<outcome>\w+) \| (?P<reason>[\w-]+) \|$")


def location() -> Path:
    """The corpus folder: ``$INFERENCE_LOG_CORPUS`` when set, else ``../shared/fixtures/logs``."""
    env = os.environ.get("INFERENCE_LOG_CORPUS")
    return Path(env) if env else DEFAULT


def require() -> Path:
    """The corpus folder; skips the calling module (fails under ``CI``) when it is missing."""
    where = location()
    if (where / "README.md").is_file():
        return where
    message = (
        f"log corpus not found at {where}: this module's corpus tests are skipped "
        "(set INFERENCE_LOG_CORPUS to the folder of real engine logs)"
    )
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


def expected_results(where: Path) -> dict[str, tuple[str, str | None]]:
    """File name -> (outcome, reason or None), from the README's expected-result table."""
    text = (where / "README.md").read_text(encoding="utf-8")
    section = text.split("## Expected result", 1)[1]
    rows = (_ROW.match(line.strip()) for line in section.splitlines())
    return {
        m["file"]: (m["outcome"], None if m["reason"] == "-" else m["reason"]) for m in rows if m
    }
