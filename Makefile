# Two commands on a fresh machine:
#   make chat   installs everything (builds llama.cpp, pulls the qwen-coder weights) and starts `edgekit chat`
#   make test   installs the test extras, lints and type-checks, pulls the small gemma pair, runs the test suite
# Everything lives in .venv; model weights in ~/.cache/edgekit/models (EDGEKIT_CACHE_DIR overrides).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Compiling llama.cpp on 2 cores takes ~8 minutes; pip caches the wheel afterwards.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST_ARGS ?=

.PHONY: chat test test-all lint typecheck install models-test models-chat predictors traces figures clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml setup.py edgekit/runtime/_logitstats.c edgekit/runtime/_logitstats_kernel.h edgekit/runtime/_logitstats_kernels.h | $(BIN)/python
	@echo "installing edgekit and its dependencies (llama.cpp compiles on first install: ~8 min on 2 cores)"
	$(BIN)/python -m pip install --quiet -e '.[api,train,bench,server,test]'
	touch $@

install: $(VENV)/.installed

models-test: install
	$(BIN)/edgekit models pull gemma-270m smollm2-135m-instruct

models-chat: install
	$(BIN)/edgekit models pull qwen-coder

chat: models-chat
	$(BIN)/edgekit chat

test: lint typecheck models-test
	$(BIN)/python -m pytest -m "not slow" -q $(PYTEST_ARGS)

test-all: lint typecheck models-test models-chat
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

# mypy checks the package as it installs: models/, predictors/ and cli/ are edgekit.models, ...
# A tree of links under build/ puts each folder where it installs.
TYPECHECK_TREE := build/typecheck
typecheck: install
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)/edgekit
	for f in edgekit/*; do ln -s "$(CURDIR)/$$f" $(TYPECHECK_TREE)/edgekit/; done
	for d in models predictors semantic cli; do ln -s "$(CURDIR)/$$d" $(TYPECHECK_TREE)/edgekit/$$d; done
	MYPYPATH=$(TYPECHECK_TREE) $(BIN)/mypy --cache-dir build/mypy-cache -p edgekit

# Every figure the README shows, redrawn from benchmarks/results/*.json (no model runs).
figures: install
	$(BIN)/python benchmarks/figures.py

# The shipped rejection predictors, from the traces in predictors/traces/ (seconds, deterministic).
predictors: install
	$(BIN)/edgekit predictor train predictors/traces/gemma-270m.npz -o predictors/shipped/gemma-270m
	$(BIN)/edgekit predictor train predictors/traces/qwen-coder.npz -o predictors/shipped/qwen-coder

# Those traces, collected again over predictors/prompts/train.jsonl (~20 + ~35 min on 2 cores).
traces: models-test models-chat
	$(BIN)/edgekit predictor collect --pair gemma-270m -o predictors/traces/gemma-270m.npz --window 8 --max-tokens 64
	$(BIN)/edgekit predictor collect --pair qwen-coder -o predictors/traces/qwen-coder.npz --window 8 --max-tokens 32 --numerics fast

clean:
	rm -rf $(VENV)
