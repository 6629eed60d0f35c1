# Each target installs what it needs into .venv (created with python3 if missing).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test demo install clean

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

demo: $(VENV)/.installed-dev
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .hypothesis
