# Two commands for a new user: `make book` and `make test`. Everything else is set up on the way.
SHELL := /bin/bash
# Python 3.12: the first python3.12 that runs (a pyenv shim that names no installed 3.12 does not), else pyenv's own.
PYTHON ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
VENV := .venv
# Python keeps the bytecode it compiles (.pyc, in the venv and src/): where PYTHONDONTWRITEBYTECODE is set, as on this
# project's machines, every Python process compiled again every source it imported. Importing diffeqformer.train took
# 13.0 s that way and 5.5-5.9 s with the .pyc files, and a `make book` starts some forty Python processes (training
# workers, notebook kernels, F9's measurements, the book's build). uv's --compile-bytecode would compile every
# installed file at install time instead (+26 s); this compiles what is imported, once.
unexport PYTHONDONTWRITEBYTECODE
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup test test-slow book clean-book help

help:
	@echo "make book       set up, run the default (cpu) workflow, build the Jupyter Book (PRESET=smoke|gpu|paper: another)"
	@echo "make test       set up, run the unit tests and, beside them, the smoke workflow and a browser check of its book"
	@echo "make test-slow  the tests marked slow"

# The virtual environment: pinned versions from requirements.lock (pip constraints), the project in editable mode,
# installed by uv (from PyPI, pinned in the lock too): it fetches and unpacks the ~270 packages in parallel.
$(STAMP): pyproject.toml requirements.lock
	@[ -n "$(PYTHON)" ] && command -v $(PYTHON) >/dev/null || { echo "error: no Python 3.12 found; this project needs Python 3.12 (install it, or set PYTHON=/path/to/python3.12)" >&2; exit 1; }
	@if [ -x $(PY) ] && ! $(PY) -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then \
		echo "$(VENV) holds another Python: making it again with $(PYTHON)"; rm -rf $(VENV); fi
	@start=$$(date +%s); \
	$(PYTHON) -m venv $(VENV) && \
	$(PY) -m pip install --quiet -c requirements.lock uv && \
	$(VENV)/bin/uv pip install --quiet --python $(PY) -c requirements.lock -e ".[test]" pip setuptools wheel && \
	echo "installed in $$(( $$(date +%s) - start )) s"
	@touch $(STAMP)

setup: $(STAMP)

# The unit tests (two workers) and, beside them, the smoke workflow end to end and the browser check of its book (one
# process: one workflow run serves both; its output goes to $(SMOKE_LOG) and is printed when the unit tests are done).
# Side by side they keep both cores busy where either alone leaves one idle (the end of the unit tests, the book's
# build, the browser; measured: the Measurements page, `make test`). The smoke workflow's runs,
# cache and book stay in $(SMOKE_HOME), so a second `make test` with nothing changed re-uses them. pytest exits 5 when
# it collected no test: a failure here. All share one JAX persistent compilation cache (tests/conftest.py,
# _build/test-jax-cache): a program one of them compiled, the others load. Each prints its slowest tests at the end
# (DURATIONS), so that a slow new test shows in CI's log.
SMOKE_HOME := $(CURDIR)/_build/smoke-home
# The test files that hold tests marked `pipeline`: the smoke process collects only these (the others' imports, some
# 3 CPU-seconds, bought it nothing).
PIPELINE_TESTS = $(shell grep -l "mark.pipeline" tests/test_*.py)
SMOKE_LOG := _build/smoke-test.log
DURATIONS := --durations=25 --durations-min=5
test: setup
	@mkdir -p _build; status=0; \
	echo "the smoke workflow and the browser check run beside the unit tests: $(SMOKE_LOG) (printed at the end)"; \
	DIFFEQFORMER_SMOKE_HOME=$(SMOKE_HOME) $(PY) -m pytest -m pipeline -s -p no:cacheprovider $(DURATIONS) \
		$(PIPELINE_TESTS) >$(SMOKE_LOG) 2>&1 & smoke=$$!; \
	trap 'kill $$smoke 2>/dev/null' INT TERM; \
	$(PY) -m pytest -m "not slow and not pipeline" -n 2 --dist loadfile --no-loadscope-reorder $(DURATIONS) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: no unit tests were collected" >&2; rc=1; fi; [ $$rc -eq 0 ] || status=$$rc; \
	wait $$smoke; rc=$$?; cat $(SMOKE_LOG); \
	if [ $$rc -eq 5 ]; then echo "error: no smoke-workflow tests were collected" >&2; rc=1; fi; [ $$rc -eq 0 ] || status=$$rc; \
	exit $$status

test-slow: setup
	@$(PY) -m pytest -m slow $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: no slow tests were collected" >&2; exit 1; fi; exit $$rc

# The workflow (workflow/Snakefile) on every core: trains what is missing, executes the notebooks whose inputs changed,
# builds the book and points _build/html and figures/ at it. PRESET=smoke, gpu or paper chooses another preset.
PRESET ?= cpu
SNAKEMAKE = $(VENV)/bin/snakemake -s workflow/Snakefile --cores all --rerun-incomplete \
	--quiet rules --config preset=$(PRESET)
book: setup
	$(SNAKEMAKE)

clean-book:
	rm -rf _build/html _build/workflow _build/published.json _build/smoke-home figures .snakemake
