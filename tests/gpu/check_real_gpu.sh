#!/usr/bin/env bash
# One-command check on a host with an NVIDIA or AMD GPU: a child process allocates GPU memory
# (torch, else libcudart, else HIP, else the CUDA driver API) and the exporter's GPU source,
# through the real NVML or amd-smi (each one whose library is found), must attribute that memory
# to the child's pid. Exit 0 with "PASS: ...", 1 with "FAIL: ...". Extra arguments go to
# check_real_gpu.py (--bytes N; --vendor nvidia|amd; --simulate checks the plumbing of both
# vendors without a GPU).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
cd "$root"
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$python" tests/gpu/check_real_gpu.py "$@"
