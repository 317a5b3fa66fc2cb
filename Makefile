# Two entry points for a newcomer: `make up` (install + run the stack) and `make test`;
# `make test-fast` runs the unit lane alone, `make test-integration` the other lane, `make fmt`
# formats and fixes what ruff can, `make typecheck` runs mypy.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install up test test-fast test-integration lint fmt typecheck bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $@

up: install
	$(BIN)/claw-stream up

lint: install typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/codespell
	$(BIN)/claw-stream topics schemas --check

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: install
	$(BIN)/mypy

# tests/unit (no broker, no Postgres, no model; under 60 s), then tests/integration
test: lint
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest tests/unit

test-integration: install
	$(BIN)/python -m pytest tests/integration

bench: install
	$(BIN)/python bench/broker_bench.py
