# Two entry points for a newcomer: `make up` (install + run the stack) and `make test`;
# `make test-fast` runs the unit lane alone.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install up test test-fast lint bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $@

up: install
	$(BIN)/claw-stream up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/claw-stream topics schemas --check

# tests/unit (no broker, no Postgres, no model; under 60 s), then tests/integration
test: lint
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest tests/unit

bench: install
	$(BIN)/python bench/broker_bench.py
