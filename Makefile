# Two commands: `make test` and `make demo`. Each sets up what it needs first, and the set-up
# is skipped when nothing it depends on changed (the stamp file is newer than pyproject.toml).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed.stamp
# The CPU build of torch that lies on this machine's disk; an unpinned torch pulls a CUDA build.
TORCH_VERSION := 2.13.0

.PHONY: test lint demo setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[dev]" "torch==$(TORCH_VERSION)"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(PY) scripts/demo.py

clean:
	rm -rf $(VENV) .pytest_cache
