# Quick start: `make demo`, then `make test`. Both install what they need and are idempotent.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PACKAGED := common catalog exporter bridge alert_rules dashboards
# Reinstalls when pyproject.toml or the list of packaged files changes (the strict editable install
# links files, so a new module must be linked).
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-8)-$(shell find $(PACKAGED) -name '*.py' -o -name py.typed | sort | sha1sum | cut -c1-8)

# Bytecode caches on, even where the environment turns them off: without them every test run,
# and every bridge or exporter process a test starts, compiles the project (and rewrites the
# tests' asserts) from source again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help system-deps venv lint generate test suite test-fast mutants demo bench dist clean

help:
	@echo "make demo   run the whole pipeline on the two motivating scenarios (real Prometheus + Alertmanager)"
	@echo "make test   install what the suite needs and run lint + the whole test suite"
	@echo "make bench  run every benchmark, write bench/results.json and print the table"
	@echo "make test-fast  the unit layer only (no real binaries), about a minute"
	@echo "make lint   ruff and mypy"
	@echo "make generate  regenerate alert_rules/ and dashboards/ from the catalog"
	@echo "make dist   build the wheel and the sdist into dist/ (what the Slurm guide and the images install)"

system-deps:
	@bash setup/system-deps.sh

$(STAMP): pyproject.toml setup/venv.sh
	@bash setup/venv.sh $(PYTHON) $(VENV)
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy $(foreach p,$(PACKAGED),-p wandb_infra.$(p)) -p demo

# Every generated file, in dependency order (the Kubernetes copies read the rule manifest and the
# dashboards; the tables of docs/restart.md and docs/figures.md, then the README's demo sample, the
# saved view rendered by the current code, come last). tests/test_generated.py checks in one test
# that all but the sample are current; tests/test_readme.py checks the sample.
generate: venv
	$(BIN)/python -m wandb_infra.alert_rules.generate
	$(BIN)/python -m wandb_infra.dashboards.generate
	$(BIN)/python deploy/kubernetes/render.py
	$(BIN)/python -m tests.rules.build
	$(BIN)/python -m tests.readme_tables
	$(BIN)/python -m tests.test_readme

# Lint runs beside the tests (a lint failure still fails `make test`, once the tests are done):
# the suite leaves the cores about half idle.
test: system-deps venv
	@$(MAKE) --no-print-directory -j2 lint suite

# Four workers on two cores: stack tests spend most of their time waiting for rules and alerts
# (three workers kept the two cores about half busy), so the extra workers fill the idle time.
# The tests of a file that share a module fixture (a running stack) stay on one worker; every
# other test goes to whichever worker is free, longest work first (tests/conftest.py); every
# service a test starts listens on a free port.
suite: venv
	$(BIN)/python -m pytest -q -n 4 --dist loadgroup --no-loadscope-reorder

# The unit layer only (no real binaries; about a minute): the inner loop while editing.
test-fast: venv
	WANDB_INFRA_TEST_FAST=1 $(BIN)/python -m pytest -q -n 2 --dist loadgroup -m unit

# Deliberate bugs the suite must catch (tests/mutants.py): each one applied, its tests run, the
# file restored. Not part of `make test`: about ten minutes on 2 cores.
mutants: system-deps venv
	$(BIN)/python -m tests.mutants

demo: system-deps venv
	$(BIN)/python -m demo $(DEMO_ARGS)

bench: system-deps venv
	$(BIN)/python -m bench.run

# The wheel and the sdist, each built in an isolated environment from pyproject.toml;
# tests/test_packaging.py builds them the same way, installs the wheel into a fresh virtualenv and
# runs both console scripts.
DIST ?= dist
dist: venv
	rm -rf $(DIST)
	$(BIN)/python -m build --outdir $(DIST) .
	@ls -l $(DIST)

clean:
	rm -rf .state bench/results.json dist
