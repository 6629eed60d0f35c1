# Each target installs what it needs into .venv (created with python3 if missing).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test demo install clean docs docs-serve docs-offline lint workspace grade bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall (editable) only when pyproject.toml changes; edits to src/ need no reinstall.
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed-dev

# `make test M=m07` runs one milestone's tests (M is a pytest marker expression).
M ?=

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(if $(M),-m '$(M)',)

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

# The same site, readable offline: npm installs the `mathjax@3` package into build/mathjax/
# (once), and the mkdocs hook scripts/mkdocs_mathjax.py copies its es5/ folder into site/.
# Open site/index.html in a browser, or `make docs-serve` it.
MATHJAX_ES5 := build/mathjax/node_modules/mathjax/es5

$(MATHJAX_ES5)/tex-mml-chtml.js:
	npm install --prefix build/mathjax --no-save --no-audit --no-fund mathjax@3

docs-offline: $(VENV)/.installed-docs $(MATHJAX_ES5)/tex-mml-chtml.js
	DILOCO_MATHJAX_URL=mathjax/es5/tex-mml-chtml.js DILOCO_MATHJAX_DIR=$(MATHJAX_ES5) \
		NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# ruff (configured in pyproject.toml) over the project: reports, never rewrites.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .

# Speed, measured side by side in one run: the reference path (now and at e7f3c6c), the fast
# engine, PyTorch when importable (never installed by this project) and the matmul peak. Writes
# benchmarks/results.md; 20-30 minutes on two idle cores.
bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench.py

# Learner workspace: the project with the 30 milestone bodies as stubs (docs/learner-guide.md).
WS ?= workspace

workspace: $(VENV)/.installed-dev
	$(BIN)/diloco workspace create $(WS)

grade: $(VENV)/.installed-dev
	$(BIN)/diloco grade --impl $(WS)

clean:
	rm -rf $(VENV) build dist site .pytest_cache .hypothesis
