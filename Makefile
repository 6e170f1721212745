# The two commands a user needs: `make test` and `make demo` (see README.rst).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make demo DURATION=20`: seconds of traffic; empty or 0 = until Ctrl-C.
DURATION ?= 0
DEMO_ARGS ?=
BENCH_ARGS ?=

.PHONY: test lint typecheck pytest promtool clean venv demo bench soak docs deb deb-test lock

venv: $(STAMP)

# One venv for the tests, the demo, the benchmarks and the package test: exactly the
# versions of the dev lock (which holds the package's run-time pins), nothing resolved
# today. A changed lock makes it anew, so nothing stays from the last one.
LOCKS := packaging/requirements.lock packaging/requirements-dev.lock
$(STAMP): setup.cfg pyproject.toml $(LOCKS)
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --require-hashes --only-binary=:all: -r packaging/requirements-dev.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

test: lint typecheck promtool pytest

lint: $(STAMP)
	$(BIN)/ruff check lumio_ingestd tests bench tools packaging

typecheck: $(STAMP)
	$(BIN)/mypy lumio_ingestd tests

# The alert rules: syntax, then a unit test for every rule (promtool: Debian package `prometheus`).
PROMTOOL ?= promtool
export PROMTOOL  # the dashboard test runs the same promtool
promtool:
	@command -v $(PROMTOOL) >/dev/null 2>&1 || { echo "promtool not found: apt-get install prometheus (or PROMTOOL=/path/to/promtool)" >&2; exit 1; }
	$(PROMTOOL) check rules monitoring/prometheus/lumio-ingestd.rules.yml
	$(PROMTOOL) test rules monitoring/prometheus/tests/*.yml

# In parallel: most of a test's time is waiting, so the workers outnumber the cores
# (each worker starts servers of its own). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 4
pytest: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Private servers, stand-ins and the real daemon; see README.rst, "Quick start".
demo: $(STAMP)
	$(BIN)/lumio-ingestd demo --duration $(or $(DURATION),0) $(DEMO_ARGS)

# The chaos soak (not part of `make test`): `make soak DURATION=600` (default 600 s).
# SOAK_ARGS="--seed N" replays a run's fault schedule.
SOAK_ARGS ?=
soak: $(STAMP)
	$(BIN)/python tools/soak.py --duration $(if $(filter-out 0,$(DURATION)),$(DURATION),600) $(SOAK_ARGS)

# Every benchmark in one run: one table, and bench/results/summary.json.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The generated blocks of docs/ (configuration keys, metrics), rewritten from the code.
docs: $(STAMP)
	PYTHONPATH=. $(BIN)/python tools/config_docs.py
	PYTHONPATH=. $(BIN)/python tools/metrics_docs.py

# The Debian package: dist/lumio-ingestd_<version>_<arch>.deb (as root; packaging/build_deb.py).
deb:
	python3 packaging/build_deb.py

# Installs dist/'s package into a throwaway root and checks it (as root; packaging/deb_test.py).
deb-test: $(STAMP)
	$(BIN)/python packaging/deb_test.py $(DEB)

# Re-resolves both lock files from setup.cfg's ranges (packaging/lock.py says when).
lock:
	python3 packaging/lock.py
