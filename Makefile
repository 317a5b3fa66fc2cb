# Two entry points for a newcomer: `make up` (install + run the stack) and `make test`;
# `make test-fast`, `make test-component` and `make test-e2e` run one lane each (tests/lanes.py),
# `make fmt` formats and fixes what ruff can, `make typecheck` runs mypy, `make docs` builds the
# documentation site into site/.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install up test test-fast test-component test-e2e lint style fmt typecheck bench docs site

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

# the documentation site into site/: the reference pages written from the code, then a strict
# build (a broken link, a missing page or a page left out of the nav fails)
docs: install
	$(BIN)/python -m claw_stream.cli.reference
	$(MAKE) site

# the build alone, as `make test` runs it (a unit test fails when a reference page is stale)
site: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the quick checks and the site, then the three lanes one after the other, each in parallel processes
# (tests/lanes.py prints what each ran and how long it took, and keeps README's table in step),
# with mypy beside them (on 2 cores it overlaps the unit lane)
test: style site
	$(BIN)/mypy > .mypy.log 2>&1 & typing=$$!; \
	$(BIN)/python -m tests.lanes; tests=$$?; \
	wait $$typing; typed=$$?; cat .mypy.log; \
	[ $$typed -eq 0 ] || echo "mypy failed (above)"; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

test-fast: install
	$(BIN)/python -m tests.lanes unit

test-component: install
	$(BIN)/python -m tests.lanes component

test-e2e: install
	$(BIN)/python -m tests.lanes e2e

bench: install
	$(BIN)/python bench/broker_bench.py
