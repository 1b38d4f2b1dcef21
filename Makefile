# On a fresh machine:
#   make chat   installs everything (builds llama.cpp, pulls the qwen-coder weights) and starts `edgekit chat`
#   make test-fast  the unit tier alone (toys, no downloads; ~2.5 min on 2 cores)
#   make test   installs the test extras, lints and type-checks, pulls the small gemma pair, runs the test suite
#   make docs   builds the documentation site into build/site
# Everything lives in .venv; model weights in ~/.cache/edgekit/models (EDGEKIT_CACHE_DIR overrides).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Compiling llama.cpp on 2 cores takes ~8 minutes; pip caches the wheel afterwards.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST_ARGS ?=
# `make test` runs the integration and system tiers' files on this many processes (pytest-xdist, a
# file to a process: its module fixtures load once): most of their tests wait on servers and
# subprocesses, so two processes finish in ~0.65 of one's time on a 2-core machine. 0: one process.
PYTEST_WORKERS ?= 2
# The unit tier on three: its tests wait on sockets, threads and deadlines as much as they compute, and
# a third process fills those waits (on this 2-core machine, 2 min 36 s twice against 2 min 41 s to
# 3 min 19 s over seven runs on two; four took 3 min 4 s).
UNIT_WORKERS ?= 3

.PHONY: chat test test-fast test-vllm vllm proxies test-all test-numerics-avx2 lint typecheck install models-test models-chat predictors traces figures docs clean

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

# HAProxy and nginx for the fleet tests (tests/system/test_fleet_proxy.py): Debian's packages unpacked
# under build/proxies without root; where that cannot be done the tests skip (CI requires them).
proxies:
	@bash deploy/fetch-proxies.sh >/dev/null || echo "no haproxy/nginx for the fleet tests (deploy/fetch-proxies.sh); they skip"

# The unit tier alone (tests/unit: toys only, no model files, no network, no server processes): about
# 2.5 minutes on 2 cores, for the edit-test loop. `make test` runs it too, with everything else CI runs.
test-fast: install
	$(BIN)/python -m pytest tests/unit -q -n $(UNIT_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit tier first (a broken unit fails in minutes, before any model is pulled), then the integration
# and system tiers on the gemma pair.
test: lint typecheck test-fast models-test proxies
	$(BIN)/python -m pytest tests/integration tests/system -m "not slow and not vllm" -q -n $(PYTEST_WORKERS) \
		--dist loadfile $(PYTEST_ARGS)

# vLLM's CPU build as a verifier (tests/system/test_vllm.py): its own venv and the gemma target converted
# for it, both cached (~4 min the first time, seconds after); the tier runs ~9 min, ~8 GB RSS.
vllm: models-test
	EDGEKIT_PYTHON=$(BIN)/python engines/vllm/prepare.sh

test-vllm: vllm
	$(BIN)/python -m pytest -m "vllm" -q $(PYTEST_ARGS)

test-all: lint typecheck models-test models-chat vllm
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Every test on the real models (the `numerics` ones among them compare numbers from different
# llama.cpp paths) on a llama.cpp built for AVX2 only (GGML_NATIVE=OFF, no AVX-512), as on older CPUs: other kernels,
# another dependence on the batch size. A venv of its own; llama.cpp compiles again (~8 min).
AVX2_VENV := .venv-avx2
AVX2_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
	-DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
$(AVX2_VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(AVX2_VENV)
	$(AVX2_VENV)/bin/python -m pip install --quiet --upgrade pip
	@echo "compiling llama.cpp for AVX2 only (~8 min on 2 cores; not cached: pip's cache holds the native build)"
	CMAKE_ARGS="$(AVX2_CMAKE_ARGS)" $(AVX2_VENV)/bin/python -m pip install --quiet --no-cache-dir \
		"$$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | head -1)"
	$(AVX2_VENV)/bin/python -m pip install --quiet -e '.[api,train,bench,server,test]'
	touch $@

test-numerics-avx2: models-test $(AVX2_VENV)/.installed
	$(AVX2_VENV)/bin/python -c "import llama_cpp, sys; info = llama_cpp.llama_print_system_info().decode(); \
		print(info); sys.exit('not an AVX2-only build' if 'AVX512 = 1' in info or 'AVX2 = 1' not in info else 0)"
	$(AVX2_VENV)/bin/python -m pytest -m "(models or numerics) and not slow" -q $(PYTEST_ARGS)

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
	# what users write against the public types (never run): tests/typing/
	MYPYPATH=$(TYPECHECK_TREE) $(BIN)/mypy --cache-dir build/mypy-cache tests/typing

# The figures benchmarks/figures.py knows (every one README.md shows), redrawn from benchmarks/results/*.json (no model runs).
figures: install
	$(BIN)/python -m benchmarks figures

# The documentation site (mkdocs.yml, docs/) into build/site. --strict: a broken link or anchor, a page
# left out of the navigation or a reference mkdocstrings cannot resolve fails the build.
# tests/unit/project/test_docs.py builds it the same way and checks the commands the guides show.
# (NO_MKDOCS_2_WARNING: Material for MkDocs' banner about its own end of life, not about this site.)
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

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
