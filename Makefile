# Each target installs what it needs into .venv (created with python3 if missing).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test demo install clean docs docs-serve workspace grade

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall (editable) only when pyproject.toml changes; edits to src/ need no reinstall.
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed-dev

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

# `make demo` needs only the cli extra (progress bars, plots): a quicker install than dev.
$(VENV)/.installed-cli: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[cli]'
	touch $@

demo: $(VENV)/.installed-cli
	$(BIN)/diloco compare

# The documentation site, built strictly: a broken link, a page missing from the nav or a
# docstring mkdocstrings cannot parse fails. Offline, set DILOCO_MATHJAX_URL (see mkdocs.yml).
$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# Learner workspace: the project with the 30 milestone bodies as stubs (docs/learner-guide.md).
WS ?= workspace

workspace: $(VENV)/.installed-dev
	$(BIN)/diloco workspace create $(WS)

grade: $(VENV)/.installed-dev
	$(BIN)/diloco grade --impl $(WS)

clean:
	rm -rf $(VENV) build dist site .pytest_cache .hypothesis
