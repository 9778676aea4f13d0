#!/usr/bin/env bash
# One-command check on a host with an NVIDIA GPU: a child process allocates GPU memory (torch,
# else libcudart, else the CUDA driver API) and the exporter's GPU source, through the real NVML,
# must attribute that memory to the child's pid. Exit 0 with "PASS: ...", 1 with "FAIL: ...".
# Extra arguments go to check_real_gpu.py (--bytes N; --simulate checks the plumbing without a GPU).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
cd "$root"
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$python" tests/gpu/check_real_gpu.py "$@"
