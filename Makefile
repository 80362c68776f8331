# Two commands: `make test` and `make demo`. Each sets up what it needs first, and the set-up
# is skipped when nothing it depends on changed (the stamp file is newer than pyproject.toml).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed.stamp
# Pinned so every machine trains with the same torch. Which build `torch==2.13.0` is depends on where
# pip looks: the package index serves the CUDA 13.0 build for Linux x86_64 (it bundles the CUDA
# runtime; the machine needs an NVIDIA driver for CUDA 13.0, and a Turing or newer GPU), so on a
# GPU machine `make setup` installs a CUDA build. On our build and CI machines a CPU wheel of the
# same version lies in pip's local wheel folder, and pip prefers it there.
TORCH_VERSION ?= 2.13.0
# Another variant (an older driver, another CUDA version, or CPU only): set TORCH_INDEX to PyTorch's
# own wheel index for it, the URL PyTorch's install selector shows, ending in /whl/cu126, /whl/cu130,
# /whl/cpu ...:   make setup TORCH_INDEX=<that URL>
TORCH_INDEX ?=
TORCH_INDEX_ARGS := $(if $(strip $(TORCH_INDEX)),--index-url $(TORCH_INDEX),)

.PHONY: test test-gpu test-estimates lint demo setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_INDEX_ARGS) "torch==$(TORCH_VERSION)"
	@# This project was distributed as "torchtune" before; that name is PyTorch's torchtune, which must
	@# not share an environment with it (same import package, same `tune`). Removing it is a no-op when absent.
	$(PY) -m pip uninstall --quiet --yes torchtune 2>/dev/null || true
	rm -rf torchtune.egg-info
	$(PY) -m pip install --quiet -e ".[dev]" "torch==$(TORCH_VERSION)"
	@# torchtune 0.6.1's published wheel, downloaded without its dependencies and never installed: the tests
	@# read torchtune's own config files from it (tests/recipes/test_torchtune_configs.py).
	$(PY) -m pip download --quiet --no-deps "torchtune==0.6.1" -d $(VENV)/peer-wheels
	$(PY) -c "import torch; print('Installed torch', torch.__version__, '-', 'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU-only build', '- GPU visible:', torch.cuda.is_available())"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# One pytest worker per core (each test runs torch on one thread, tests/conftest.py), a test file's tests on
# one worker (its module fixtures are made once). TEST_JOBS=0 runs them in this process, one at a time.
TEST_JOBS ?= auto
test: lint
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile tests

# The tests that need a CUDA GPU (tests/gpu, marked `gpu`): a few minutes on one GPU, no network.
# Where PyTorch sees no GPU each is skipped with the reason.
test-gpu: $(STAMP)
	$(PY) -m pytest -q -rs -m gpu tests/gpu

# `make test` checks every memory figure the docs and config headers quote against the outputs of
# `tune estimate-memory` stored in tests/memory_estimates.json, each kept while the code, config and packages
# it ran on are unchanged. This target runs every stale command (20 s to 6 min of CPU each, traced, in a process
# of its own, one per core at a time: TUNE_ESTIMATE_JOBS), stores its output and checks the figures: run it,
# and commit the file, when `make test` says so.
test-estimates: $(STAMP)
	TUNE_TEST_ESTIMATES=1 $(PY) -m pytest -q --timeout 0 tests/test_memory_figures.py tests/recipes/test_distributed_configs.py \
		tests/recipes/test_llama3_configs.py tests/recipes/test_hf_family_configs.py

demo: $(STAMP)
	$(PY) scripts/demo.py

clean:
	rm -rf $(VENV) .pytest_cache
