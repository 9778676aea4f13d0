# Two commands from a fresh clone: `make demo` and `make test`. Each creates the virtualenv
# and installs what is missing (Debian packages too, when run as root) before running.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Real inference engines for tests/realengines, built once and cached by tools/real-engines.sh.
export LLAMA_SERVER ?= $(shell tools/real-engines.sh env LLAMA_SERVER)
export VLLM_PYTHON ?= $(shell tools/real-engines.sh env VLLM_PYTHON)

.PHONY: demo test lint bench clean real-engines

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	tools/install-system-packages.sh demo
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml tools/install-system-packages.sh | $(BIN)/python
	tools/install-system-packages.sh test
	$(BIN)/python -m pip install -q -e '.[dev,journal]'
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/python -m exporter_tooling demo

lint: $(VENV)/.installed-test
	$(BIN)/python -m ruff check exporter exporter_tooling tests
	$(BIN)/python -m ruff format --check exporter exporter_tooling tests
	$(BIN)/python -m mypy
	test -z "$$(gofmt -l tools/helm-render)" || { gofmt -l tools/helm-render; exit 1; }
	cd tools/helm-render && GO111MODULE=off GOPATH=/usr/share/gocode go vet .

real-engines: $(VENV)/.installed-test
	tools/real-engines.sh install

test: lint real-engines
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/python -m exporter_tooling bench

clean:
	rm -rf $(VENV) build *.egg-info
