# Respawn — the two commands: `make demo` and `make test`.
# Both install whatever is missing first (virtualenv, Python packages, and the
# testbed binaries built from the Go module proxy into ~/.cache/respawn).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit integration binaries images release venv lock down clean

# The services' dependencies at the versions the image has (requirements.lock), then the rest.
$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=python3.x'"; exit 1; }
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# requirements.lock again, after a change to the dependencies in pyproject.toml: the versions
# already locked stay where they still satisfy it (`UV=/path/to/uv`; `pip install uv` gives one).
UV ?= uv
lock:
	$(UV) pip compile pyproject.toml tools/lock/build-system.in --universal --generate-hashes \
	  --python-version 3.11 --annotation-style line --custom-compile-command "make lock" -o requirements.lock

binaries:
	@tools/k8sbins/build.sh >/dev/null

# Container images without Docker or a registry (docs/deploy.md).
images: venv
	@VENV=$(VENV) tools/images/build.sh

# dist/install.yaml (deploy/release) and the two image archives it names (docs/deploy.md).
release: venv
	@VENV=$(VENV) $(BIN)/python -m respawn.release

# pytest-xdist workers for `make test`, `unit` and `integration`; each integration worker starts a
# testbed of its own (tests/conftest.py). TEST_WORKERS=0 runs the suite in this process, in order.
# Four on 2 cores: the tests wait on their testbeds often enough that a fourth worker still finds
# a core free (pytest 14 minutes on average over five runs with four, 15½ over four with three;
# README).
TEST_WORKERS ?= 4
PYTEST_WORKERS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

lint: venv
	$(BIN)/ruff check shared services respawn tests bench examples
	$(BIN)/ruff format --check shared services respawn tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest tests/unit -q $(PYTEST_WORKERS)

integration: venv binaries
	$(BIN)/pytest tests/integration -q $(PYTEST_WORKERS)

test: venv binaries lint
	$(BIN)/pytest -q --durations=40 $(PYTEST_WORKERS)

# The demo needs only the testbed `respawn local up` starts: not Kueue, promtool or crictl.
demo: venv
	@tools/k8sbins/build.sh --demo >/dev/null
	$(BIN)/respawn demo

down: venv
	$(BIN)/respawn local down

clean: down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
