# Every target creates .venv and installs the locked dependencies when they are missing,
# so a fresh clone needs nothing but Python 3.11+ and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast lint fmt schemas lock bench clean help

help:
	@echo "make run      start the whole stack (broker, simulator, worker, front-end)"
	@echo "make test     lint-free test suite against a real embedded broker"
	@echo "make lint     ruff + mypy"
	@echo "make fmt      format and auto-fix with ruff"
	@echo "make schemas  re-export schemas/ (JSON Schemas, error catalogue, OpenAPI)"
	@echo "make bench    throughput/latency benchmark (bench/results.json)"
	@echo "make lock     re-resolve requirements.lock from pyproject.toml"

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m worker stack

test: $(STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not chaos"

lint: $(STAMP)
	$(BIN)/ruff check worker tests bench
	$(BIN)/ruff format --check worker tests bench
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format worker tests bench
	$(BIN)/ruff check --fix worker tests bench

schemas: $(STAMP)
	$(BIN)/python -m worker schemas

bench: $(STAMP)
	$(BIN)/python -m worker bench

lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --upgrade pip
	.lock-venv/bin/python -m pip install -q -e '.[dev]'
	.lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^passkey-auth-worker' > requirements.lock
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
