# Two entry points for a newcomer: `make up` (install + run the stack) and `make test`;
# `make test-fast` runs the unit lane alone, `make test-integration` the other lane, `make fmt`
# formats and fixes what ruff can, `make typecheck` runs mypy.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install up test test-fast test-integration lint style fmt typecheck bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $@

up: install
	$(BIN)/claw-stream up

lint: style typecheck

# lint's quick part: ruff, codespell, the topic schemas
style: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/codespell
	$(BIN)/claw-stream topics schemas --check

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: install
	$(BIN)/mypy

# the quick checks, then tests/unit (no broker, no Postgres, no model; under 60 s) and
# tests/integration, with mypy beside them (on 2 cores it overlaps the unit lane: ~50 s saved)
test: style
	$(BIN)/mypy > .mypy.log 2>&1 & typing=$$!; \
	$(BIN)/python -m pytest; tests=$$?; \
	wait $$typing; typed=$$?; cat .mypy.log; \
	[ $$typed -eq 0 ] || echo "mypy failed (above)"; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

test-fast: install
	$(BIN)/python -m pytest tests/unit

test-integration: install
	$(BIN)/python -m pytest tests/integration

bench: install
	$(BIN)/python bench/broker_bench.py
