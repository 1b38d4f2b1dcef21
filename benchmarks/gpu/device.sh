#!/usr/bin/env bash
# The GPU suite on a lent GPU machine that reaches no network (benchmarks/gpu/README.md).
#
# What it needs travels in the ignored folder .gpu/, a piece per call (a call carries at most
# 64 MiB): .gpu/pkg.tgz (llama-cpp-python's Python files with llama.cpp's libraries built for
# CUDA and llama-server beside them, and the wheels the machine's Python lacks) and
# .gpu/model.partNN (the gemma target, gzip, split). Each call first moves what it carried to $STAGE, which lasts while the machine
# is held.
#
#   bash benchmarks/gpu/device.sh stage         # after each carrying call
#   bash benchmarks/gpu/device.sh check         # the environment: GPU, imports, offload
#   bash benchmarks/gpu/device.sh run [ARGS]    # assemble the model, then suite.py --out $OUT ARGS
#   bash benchmarks/gpu/device.sh replicas [ARGS]  # fleet_replicas.py on the GPU, HAProxy from the
#                                               # Debian packages carried in build/proxies/debs
#   bash benchmarks/gpu/device.sh goodput [ARGS]   # issue 51: a random 7B-shaped target made here from the
#                                               # carried .gpu/tokenizer.gguf, then goodput.py --out $OUT ARGS
#                                               # (.gpu/traces.json, and .gpu/roofline.json where carried;
#                                               # .gpu/onnx.tgz, onnxruntime, for the predictor and wisp)
set -euo pipefail
STAGE=${EDGEKIT_GPU_STAGE:-/tmp/edgekit-gpu}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$STAGE/parts"

stage() {
    shopt -s nullglob
    for f in "$ROOT"/.gpu/model.part*; do mv "$f" "$STAGE/parts/"; done
    for t in extra onnx; do  # wheels that came later, one folder each
        if [ -f "$ROOT/.gpu/$t.tgz" ]; then tar xzf "$ROOT/.gpu/$t.tgz" -C "$STAGE"; rm "$ROOT/.gpu/$t.tgz"; fi
    done
    if [ -f "$ROOT/.gpu/pkg.tgz" ]; then rm -rf "$STAGE/pkg"; tar xzf "$ROOT/.gpu/pkg.tgz" -C "$STAGE"; rm "$ROOT/.gpu/pkg.tgz"; fi
    for f in tokenizer.gguf traces.json roofline.json; do  # goodput's pieces
        if [ -f "$ROOT/.gpu/$f" ]; then mv "$ROOT/.gpu/$f" "$STAGE/$f"; fi
    done
    ls -l "$STAGE" "$STAGE/parts"
}

environment() {
    local site="$STAGE/site" tree="$STAGE/pytree"
    if [ ! -d "$site/llama_cpp" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$STAGE"/pkg/wheels/*.whl
        cp -r "$STAGE/pkg/llama_cpp" "$site/"
    fi
    for t in extra onnx; do  # wheels that came later
        if [ -d "$STAGE/$t/wheels" ] && [ ! -f "$site/.$t" ]; then
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
                "$STAGE/$t"/wheels/*.whl && touch "$site/.$t"
        fi
    done
    # edgekit from the checkout, laid out as its install does (pyproject's package-dir)
    rm -rf "$tree" && mkdir -p "$tree/edgekit"
    for f in "$ROOT"/edgekit/*; do ln -s "$f" "$tree/edgekit/"; done
    for d in models predictors semantic cli; do ln -s "$ROOT/$d" "$tree/edgekit/$d"; done
    ln -s "$ROOT/benchmarks" "$tree/benchmarks"  # run as `python3 -m benchmarks NAME`, found here
    (cd "$ROOT" && python3 setup.py -q build_ext --inplace >/dev/null 2>&1) || echo "no C kernel: numpy statistics"
    local cublas
    # cuBLAS from the machine's PyTorch (nvidia-cublas), else its CUDA toolkit
    cublas=$(dirname "$( { find "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)" \
        /usr/local/cuda/lib64 -name 'libcublas.so.13' 2>/dev/null || true; } | head -1)")
    export LD_LIBRARY_PATH="$site/llama_cpp/lib:$cublas:${LD_LIBRARY_PATH:-}"
    # PYTHONSAFEPATH: the checkout's own edgekit/ (no cli/ inside) must not shadow the tree from the cwd
    export PYTHONPATH="$tree:$site" PYTHONSAFEPATH=1 EDGEKIT_CACHE_DIR="$STAGE/cache/models" PYTHONUNBUFFERED=1
    export PATH="$site/llama_cpp/lib:$PATH"  # llama-server, beside the libraries it loads
}

model() {
    local dst="$STAGE/cache/models/gemma-3-270m-q4_k_m.gguf"
    mkdir -p "$(dirname "$dst")"
    if [ ! -f "$dst" ]; then cat "$STAGE"/parts/model.part* | gunzip > "$dst"; fi
    # checks the target's sha256 and derives the draft from it (no network needed for either)
    python3 -c "from edgekit.cli.app import main; main()" models pull gemma-270m
}

case "${1:-}" in
    stage) stage ;;
    check)
        stage
        environment
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        nproc; python3 -V
        python3 -c "import llama_cpp, edgekit; from edgekit.runtime import gpu_offload, llama_build; \
print('gpu offload', gpu_offload()); print(llama_build()['llama_build'])"
        llama-server --version 2>&1 | tail -3
        ;;
    run)
        shift
        stage
        environment
        model
        out=${OUT:-$STAGE/out}
        status=0
        python3 -m benchmarks gpu.suite --out "$out" --logs "$STAGE/logs" \
            --llama-server "$(command -v llama-server)" "$@" || status=$?
        tar czf "$out/logs.tgz" -C "$STAGE" logs  # one file: a call brings back at most 8
        exit $status
        ;;
    replicas)
        shift
        stage
        environment
        model
        bash "$ROOT/deploy/fetch-proxies.sh"  # unpacks the carried debs (no network there)
        out=${OUT:-$STAGE/out}
        status=0
        python3 -m benchmarks fleet_replicas --gpu-layers -1 --out "$out" --logs "$STAGE/logs" "$@" || status=$?
        tar czf "$out/logs.tgz" -C "$STAGE" logs
        exit $status
        ;;
    goodput)
        shift
        stage
        environment
        shape=${EDGEKIT_GPU_SHAPE:-qwen2.5-7b}
        target="$STAGE/target/$shape-random-f16.gguf"
        if [ ! -f "$target" ]; then  # written here: no weights can be fetched (make_target.py)
            python3 -m benchmarks gpu.make_target --shape "$shape" --tokenizer "$STAGE/tokenizer.gguf" \
                --types f16 --out "$STAGE/target"
        fi
        roofline=()
        if [ -f "$STAGE/roofline.json" ]; then roofline=(--roofline "$STAGE/roofline.json"); fi
        out=${OUT:-$STAGE/out}
        status=0
        python3 -m benchmarks gpu.goodput --target "$target" --traces "$STAGE/traces.json" "${roofline[@]}" \
            --llama-server "$(command -v llama-server)" --out "$out" --logs "$STAGE/logs" \
            --server-cores 0-1 --loadgen-cores "2-$(($(nproc) - 1))" "$@" || status=$?
        tar czf "$out/logs.tgz" -C "$STAGE" logs
        exit $status
        ;;
    *) echo "usage: $0 stage|check|run|replicas|goodput [args]" >&2; exit 2 ;;
esac
