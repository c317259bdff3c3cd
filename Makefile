# Quickstart: `make demo` (embedded end-to-end RISE-RL on CPU) and `make test` (the full test suite).
# Both create ./.venv on first use (CPU torch pinned by .ci/constraints-cpu.txt).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := .ci/constraints-cpu.txt
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Ray must stay on loopback (DESIGN.md §5).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0

.PHONY: install test lint unit demo bench clean

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) torch==2.13.0
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

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
