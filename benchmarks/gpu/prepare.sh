#!/usr/bin/env bash
# Prepares here, on a machine without a GPU, what benchmarks/gpu/device.sh carries to a lent GPU
# machine (benchmarks/gpu/README.md), into the ignored folder .gpu/:
#   .gpu/pkg.tgz      llama-cpp-python's Python package with llama.cpp built for CUDA (sm_90: H100,
#                     H200) and llama-server beside its libraries, and the wheels that machine lacks
#   .gpu/extra.tgz    typer's pydantic and its own needs, grpcio-reflection (wheels)
#   .gpu/model.part0N the gemma target, gzip, in four parts of ~59 MB (a call carries 64 MiB)
#   .gpu/tokenizer.gguf, .gpu/traces.json, .gpu/roofline.json  goodput's (issue 51): the Qwen2.5
#                     tokenizer's keys alone (5.9 MB), the qwen-coder pair's recorded drafting, and the
#                     H200 roofline of the 7B shape where ../shared/gpu has it
#   .gpu/onnx.tgz     onnxruntime's wheel (28 MB, a call of its own): the predictor's and wisp's devices
# Needs CUDA's nvcc (13.0 was on these machines, at /usr/local/cuda) and root to add cuBLAS to it;
# the build takes ~22 min on 2 cores. Each step is skipped when its output is there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${EDGEKIT_PYTHON:-$ROOT/.venv/bin/python}
WORK=${EDGEKIT_GPU_BUILD:-$ROOT/build/gpu}
CUDA=${CUDA_HOME:-/usr/local/cuda}
VERSION=$(grep -o 'llama-cpp-python==[0-9.]*' "$ROOT/pyproject.toml" | head -1 | cut -d= -f3)
OUT=${EDGEKIT_GPU_OUT:-$ROOT/.gpu}
mkdir -p "$WORK" "$OUT"
grep -qx '/.gpu/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$ROOT/.git/info/exclude"
wheels() {  # NAME==VERSION ... into $1, for the machine's Python 3.12 on x86-64
    local dest=$1; shift
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dest" "$@"
}
pinned() { "$PY" -m pip show "$1" 2>/dev/null | awk '/^Version/{print $2}'; }

# 1. cuBLAS, which CUDA's compiler package here lacks: headers and libraries from NVIDIA's wheel
if [ ! -e "$CUDA/targets/x86_64-linux/lib/libcublas.so" ]; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_27_x86_64 "nvidia-cublas>=13.0,<13.1" -d "$WORK"
    rm -rf "$WORK/cublas" && unzip -q -o "$WORK"/nvidia_cublas-*.whl -d "$WORK/cublas"
    cp -n "$WORK"/cublas/nvidia/cu13/include/*.h "$CUDA/targets/x86_64-linux/include/"
    cp -n "$WORK"/cublas/nvidia/cu13/lib/*.so.13 "$CUDA/targets/x86_64-linux/lib/"
    (cd "$CUDA/targets/x86_64-linux/lib" && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
fi

# 2. llama.cpp as llama-cpp-python vendors it, for CUDA: no driver library to link against here
# (GGML_CUDA_NO_VMM), no AVX-512 assumed of the other machine's CPU
src="$WORK/llama_cpp_python-$VERSION"
if [ ! -d "$src" ]; then
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
    tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi
if [ ! -x "$WORK/build/bin/llama-server" ]; then
    cmake -S "$src/vendor/llama.cpp" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF \
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
    ninja -C "$WORK/build" -j "$(nproc)" llama llama-server
fi

# 3. the package: llama-cpp-python's Python files (from its source) and the CUDA libraries
if [ ! -f "$OUT/pkg.tgz" ]; then
    pkg="$WORK/pkg" && rm -rf "$pkg" && mkdir -p "$pkg/wheels"
    cp -r "$src/llama_cpp" "$pkg/" && rm -rf "$pkg/llama_cpp/lib" && mkdir -p "$pkg/llama_cpp/lib"
    bin="$WORK/build/bin"
    for l in ggml-base ggml-cpu ggml-cuda ggml llama llama-common mtmd; do
        cp -L "$bin/lib$l.so" "$pkg/llama_cpp/lib/lib$l.so" && ln -sf "lib$l.so" "$pkg/llama_cpp/lib/lib$l.so.0"
    done
    cp "$bin/libllama-server-impl.so" "$bin/llama-server" "$pkg/llama_cpp/lib/"
    cp -L "$CUDA/lib64/libcudart.so.13" "$pkg/llama_cpp/lib/"
    strip --strip-unneeded "$pkg"/llama_cpp/lib/*.so* "$pkg/llama_cpp/lib/llama-server" 2>/dev/null || true
    wheels "$pkg/wheels" "grpcio==$(pinned grpcio)" "grpcio-health-checking==$(pinned grpcio-health-checking)" \
        "protobuf==$(pinned protobuf)" "gguf==$(pinned gguf)" "typer==$(pinned typer)" "click==$(pinned click)" \
        "rich==$(pinned rich)" "diskcache==$(pinned diskcache)"
    tar czf "$OUT/pkg.tgz" -C "$WORK" pkg
fi
if [ ! -f "$OUT/extra.tgz" ]; then
    extra="$WORK/extra" && rm -rf "$extra" && mkdir -p "$extra/wheels"
    wheels "$extra/wheels" "pydantic==$(pinned pydantic)" "pydantic_core==$(pinned pydantic_core)" \
        "annotated-types==$(pinned annotated-types)" "typing-inspection==$(pinned typing-inspection)" \
        "grpcio-reflection==$(pinned grpcio-reflection)"
    tar czf "$OUT/extra.tgz" -C "$WORK" extra
fi

# 4. the target, in parts that fit a call beside the checkout
if [ ! -f "$OUT/model.part00" ]; then
    target=$("$PY" -c "from edgekit.models import pair_paths; print(pair_paths('gemma-270m')[1])")
    gzip -9 -c "$target" > "$WORK/target.gguf.gz"
    split -n 4 -d "$WORK/target.gguf.gz" "$OUT/model.part"
fi
# 5. goodput's pieces (issue 51): the 7B-shaped target is made there, from the tokenizer alone
if [ ! -f "$OUT/tokenizer.gguf" ]; then
    qwen=$("$PY" -c "from edgekit.models import pair_paths; print(pair_paths('qwen-coder')[1])")
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m benchmarks gpu.make_target --save-tokenizer --tokenizer "$qwen" \
        --out "$OUT"
fi
cp "$ROOT/benchmarks/results/fleet_traces_qwen-coder.json" "$OUT/traces.json"
if [ ! -f "$OUT/onnx.tgz" ]; then  # onnxruntime (28 MB): a call of its own, for the predictor's systems
    onnx="$WORK/onnx" && rm -rf "$onnx" && mkdir -p "$onnx/wheels"
    wheels "$onnx/wheels" "onnxruntime==$(pinned onnxruntime)" "flatbuffers==$(pinned flatbuffers)"
    tar czf "$OUT/onnx.tgz" -C "$WORK" onnx
fi
roofline="$ROOT/../shared/gpu/flash_1k_h200.json"
if [ -f "$roofline" ]; then cp "$roofline" "$OUT/roofline.json"; fi
ls -l "$OUT"
