"""Canaries: an API key in the engine's command line, environment, logs and the probe's key
file must not appear in /metrics, /status, the page, a record trace or the exporter's logs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.harness import ROOT, exporter, free_port, stop

pytestmark = pytest.mark.integration
CANARY = "sk-CANARY0123456789abcdef"
LAUNCH = "import sys; from exporter_tooling.__main__ import main; sys.exit(main(sys.argv[2:]))"


def test_api_keys_never_leak_into_any_output(tmp_path):
    port = free_port()
    log = tmp_path / "engine.log"
    key_file = tmp_path / "api-key"
    key_file.write_text(CANARY + "-file\n")
    key_file.chmod(0o600)
    engine = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LAUNCH,
            f"--api-key={CANARY}-argv",
            "simulate",
            "--port",
            str(port),
            "--engine",
            "vllm",
            "--weights-mb",
            "8",
            "--read-mbps",
            "16",
            "--start-seconds",
            "0.5",
            "--init-seconds",
            "0.5",
            "--log-file",
            str(log),
            "--work-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env={**os.environ, "VLLM_API_KEY": CANARY + "-env"},
        stdout=subprocess.DEVNULL,
    )
    try:
        with log.open("a") as f:
            f.write(
                f"INFO 01-23 15:48:47 [utils.py:1] non-default args: {{'api_key': "
                f"'{CANARY}-log', 'port': {port}}}\n"
            )
            f.write(
                f"ERROR 01-23 15:48:48 [server.py:2] request failed: Authorization: "
                f"Bearer {CANARY}-bearer --api-key {CANARY}-err\n"
            )
            # issue 19: shapes without a known prefix, shown as the notable line they are
            plain = "CANARYplain0123456789"
            f.write(
                f"ERROR 01-23 15:48:49 [server.py:3] upstream failed: auth_token={plain}-auth "
                f"GET http://10.0.0.1:9/v1/models?token={plain}-query&n=1 "
                f"https://user:{plain}-pw@models.example/m.bin "
                f"AWS_SECRET_ACCESS_KEY={plain}-aws\n"
            )
        toml = f"""
[[target]]
name = "secret"
engine = "vllm"
base_url = "http://127.0.0.1:{port}"
probe_timeout = "0.2s"
cmdline = "simulate --port {port}"
log_file = "{log}"
api_key_file = "{key_file}"
"""
        with exporter(tmp_path, toml, interval=0.25, args=["--log.level", "debug"]) as exp:
            doc = exp.wait_for(lambda t: t["ready"], "secret")
            assert doc["notable_lines"], "the error line is shown, redacted"
            outputs = {
                "/metrics": exp.get("/metrics").decode(),
                "/status": exp.get("/status").decode(),
                "/": exp.get("/").decode(),
            }
            record = tmp_path / "c.toml"
            record.write_text(toml)
            trace = tmp_path / "trace.jsonl"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "exporter",
                    "record",
                    "--config.file",
                    str(record),
                    "--out",
                    str(trace),
                    "--duration",
                    "1.5",
                ],
                cwd=ROOT,
                check=True,
                capture_output=True,
                timeout=60,
            )
            outputs["trace"] = trace.read_text()
        outputs["exporter log"] = exp.log_text()
    finally:
        stop(engine)
    for where, text in outputs.items():
        assert "CANARY" not in text, f"a secret reached {where}"
    assert "Authorization" in outputs["/status"] or "api_key" in outputs["/status"]
    assert "auth_token=<redacted>" in outputs["/status"], "the line is shown, redacted"
