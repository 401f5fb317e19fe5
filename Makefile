# Everyday commands. `make test` is what CI runs (.ci/run).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.arke-setup
# torch first, pinned: `pip install torch==2.13.0` takes the CPU wheel on this machine's disk;
# any other torch spec may download a multi-GB CUDA build.
TORCH  := torch==2.13.0
CODE   := arke tests benchmarks examples

.PHONY: setup demo test lint fmt bench clean distclean

setup: $(STAMP)

# Re-runs only when pyproject.toml changes (or after `make distclean`).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/python examples/demo.py

# scripts/cross-tools.sh: qemu-user and the AArch64 cross compiler for the bundle tests (apt, as root)
test: setup
	sh scripts/cross-tools.sh
	$(BIN)/python -m pytest -q -n auto

lint: setup
	$(BIN)/ruff check $(CODE)
	$(BIN)/mypy
	$(BIN)/python -m arke fmt --check arke/stdlib examples

fmt: setup
	$(BIN)/ruff check --fix $(CODE)
	$(BIN)/ruff format $(CODE)
	$(BIN)/python -m arke fmt arke/stdlib examples

bench: setup
	$(BIN)/python benchmarks/check_speed.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
