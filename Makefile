# The two commands that matter: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast test-pg install lint bench clean

$(BIN)/rc: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/python -m compileall -q src
	touch $(BIN)/rc

install: $(BIN)/rc

## A local controller and worker (rc up), jobs contending for two devices, then a clean stop.
demo: install
	bash scripts/demo.sh

## Lint, types, layering, then every test on four pytest-xdist workers (the tests mostly
## wait on sockets, processes and threads); then the store and controller tests again on
## PostgreSQL (a cluster the tests start themselves; Debian package postgresql).
test: install lint
	$(BIN)/pytest -q -n 4
	$(BIN)/pytest -q -n 4 --backend postgresql -m "not e2e and not fuzz" tests/store tests/controller

## The store and controller tests on PostgreSQL alone.
test-pg: install
	$(BIN)/pytest -q -n 4 --backend postgresql -m "not e2e and not fuzz" tests/store tests/controller

## The edit-test loop: every test but those that start real rc processes or fuzz the API,
## on four pytest-xdist workers (the tests mostly wait on sockets and threads, so four
## keep two cores busy): about 2 min 15 s on 2 cores, 5 min 30 s one at a time.
test-fast: install
	$(BIN)/pytest -q -n 4 -m "not e2e and not fuzz"

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy src
	$(BIN)/mypy --warn-unused-ignores tests bench --exclude '^tests/(controller|worker)/'
	$(BIN)/mypy --warn-unused-ignores tests/controller
	$(BIN)/mypy --warn-unused-ignores tests/worker
	$(BIN)/lint-imports

bench: install
	$(BIN)/python bench/latency.py

clean:
	rm -rf $(VENV) .demo
