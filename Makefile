# Two commands for a new user: `make book` and `make test`. Everything else is set up on the way.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup test test-slow book clean-book help

help:
	@echo "make book       set up, run the default (cpu) pipeline, build the Jupyter Book"
	@echo "make test       set up, run the test suite (the slow tests are left out)"
	@echo "make test-slow  the tests marked slow"

# The virtual environment: pinned versions from requirements.lock (pip constraints), the project in editable mode.
$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; this project needs Python 3.11 (set PYTHON=...)" >&2; exit 1; }
	@start=$$(date +%s); \
	$(PYTHON) -m venv $(VENV) && \
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel && \
	$(PY) -m pip install --quiet -c requirements.lock -e ".[test]" && \
	echo "installed in $$(( $$(date +%s) - start )) s"
	@touch $(STAMP)

setup: $(STAMP)

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
test: setup
	@$(PY) -m pytest -m "not slow" -n 2 --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: no tests were collected" >&2; exit 1; fi; exit $$rc

test-slow: setup
	@$(PY) -m pytest -m slow $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: no slow tests were collected" >&2; exit 1; fi; exit $$rc

book: setup
	@echo "note: the figure pipeline (python -m diffeqformer.pipeline) is not yet available;" \
	      "this builds the book's text chapters only." >&2
	$(VENV)/bin/jupyter-book build . --warningiserror --nitpicky --keep-going
	@echo "book: $(CURDIR)/_build/html/index.html"

clean-book:
	rm -rf _build
