#!/usr/bin/env bash
# The edgekit client on an emulated arm64 Debian (issue 19), end to end on an x86-64 machine:
#
#   1. qemu-user-static registered with binfmt_misc, so that arm64 programs run in a chroot;
#   2. a Debian bookworm arm64 root (debootstrap) with Python 3.11, gcc and the Python headers;
#   3. llama-cpp-python cross-compiled here (aarch64-linux-gnu-g++: a compile under emulation
#      takes hours), the rest of the client's packages from PyPI's aarch64 wheels, pip running
#      emulated, and edgekit itself (its C kernel compiled by the emulated gcc);
#   4. the client's unit tests on fakes, and `edgekit generate` against a verifier on this
#      machine's loopback (the chroot shares the network), checked against target-only output.
#
#   sudo bash tests/arm64/emulated_client.sh [ROOT]        (default /opt/edgekit-arm64)
#   SKIP_TESTS=1 ...: everything but the test run (9 minutes here)
#
# Needs root (chroot, mount), the Debian mirror and PyPI. Each step's seconds go to
# $ROOT/timings.txt; emulated time is not device time (qemu runs 5-20x slower than a core).
set -euo pipefail
ROOT=${1:-/opt/edgekit-arm64}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
HOST_PY=${HOST_PY:-$REPO/.venv/bin/python}
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
WORK=${WORK:-/tmp/edgekit-arm64-build}
mkdir -p "$WORK"

step() {  # step NAME COMMAND...: runs it and appends its wall time
    local name=$1 t0 t1
    shift
    echo "== $name" >&2  # stderr: a step's stdout may be its result
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    printf '%-40s %8.1f s\n' "$name" "$(echo "$t1 - $t0" | bc)" | tee -a "$ROOT/timings.txt" >&2
}

in_root() {
    chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/venv/bin:/usr/bin:/bin LANG=C.UTF-8 \
        SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
        PIP_DEFAULT_TIMEOUT=180 PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}

# 1. binfmt_misc: the kernel hands arm64 ELF files to qemu (F: the emulator is opened now, so it
#    need not exist inside the chroot)
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
fi

# 2. the root
mkdir -p "$ROOT"
touch "$ROOT/timings.txt"
if [ ! -x "$ROOT/usr/bin/python3" ]; then
    step "debootstrap (arm64, emulated 2nd stage)" debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates \
        bookworm "$ROOT" http://deb.debian.org/debian
fi
SERVER=
cleanup() {
    [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true
    for m in proc/cpuinfo dev sys proc; do
        mountpoint -q "$ROOT/$m" && umount "$ROOT/$m" || true
    done
}
trap cleanup EXIT
for fs in proc sys dev; do
    mountpoint -q "$ROOT/$fs" || mount --bind "/$fs" "$ROOT/$fs"
done
# qemu-user shows programs this machine's /proc/cpuinfo; onnxruntime's CPU detection (cpuinfo)
# crashes on x86 text under aarch64, so the root sees an ARM one (a Cortex-A76, as in a Pi 5)
mountpoint -q "$ROOT/proc/cpuinfo" || mount --bind "$REPO/tests/arm64/cpuinfo-cortex-a76" "$ROOT/proc/cpuinfo"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# this machine's CA bundle and pip settings (a proxy that inspects TLS, a local index)
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
fi
if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$ROOT/etc/pip.conf"; fi

# 3a. llama-cpp-python, cross-compiled: its sdist built by scikit-build-core with the aarch64
#     toolchain; the wheel is tagged for this machine but holds arm64 libraries, so its files
#     are unpacked into the arm64 environment rather than installed by pip.
WHEEL=$(ls "$WORK"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)
if [ -z "$WHEEL" ]; then
    step "download llama-cpp-python sdist" "$HOST_PY" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$WORK"
    CMAKE_ARGS="-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        step "cross-compile llama-cpp-python" "$HOST_PY" -m pip wheel --quiet --no-deps \
        "$WORK"/llama_cpp_python-"$LLAMA_CPP_PYTHON".tar.gz -w "$WORK"
    WHEEL=$(ls "$WORK"/llama_cpp_python-*.whl | head -1)
fi

# 3b. the environment: pip, and every package, emulated
if [ ! -x "$ROOT/venv/bin/python" ]; then
    step "python -m venv (emulated)" in_root python3 -m venv /venv
fi
step "pip install the client's packages (emulated)" in_root pip install --quiet numpy "grpcio>=1.85.1" \
    "grpcio-health-checking>=1.85.1" "protobuf>=7.35.1" "typer>=0.12" "rich>=13" "psutil>=5.9" \
    "onnxruntime>=1.18" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "setuptools>=77" wheel \
    "typing-extensions>=4.5" diskcache jinja2 "grpcio-tools==1.85.1" "scipy>=1.11"
SITE=$(in_root python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
step "unpack the cross-compiled llama-cpp-python" "$HOST_PY" -m zipfile -e "$WHEEL" "$ROOT$SITE"
file "$ROOT$SITE"/llama_cpp/lib/libllama.so | grep -q "ARM aarch64"

rm -rf "$ROOT/edgekit" && mkdir -p "$ROOT/edgekit"
(cd "$REPO" && git ls-files -z | xargs -0 cp --parents -t "$ROOT/edgekit")
step "pip install edgekit (emulated gcc builds its kernel)" in_root sh -c \
    "cd /edgekit && pip install --quiet --no-deps --no-build-isolation ."
in_root python -c "import edgekit.runtime as r, platform; print(platform.machine(), 'kernel', r.KERNEL)"

# 4a. the client's tests on fakes (and the kernel check, compiled by the emulated gcc): no model
#     is loaded, but the fixtures want the gemma pair's files in the cache
MODELS=${EDGEKIT_CACHE_DIR:-$HOME/.cache/edgekit/models}
mkdir -p "$ROOT/root/.cache/edgekit/models"
cp -u "$MODELS"/gemma-3-270m-q4_0.gguf* "$MODELS"/gemma-3-270m-q4_k_m.gguf "$ROOT/root/.cache/edgekit/models/"
TESTS="tests/unit/runtime/test_features.py tests/system/test_kernel_check.py tests/unit/protocol/test_proto.py tests/unit/protocol/test_verdict.py \
tests/unit/client/test_session.py tests/unit/client/test_many.py tests/unit/runtime/test_draft_pool.py tests/unit/plan/test_plan.py tests/unit/runtime/test_device.py \
tests/unit/verifier/test_budgets.py tests/unit/link/test_link.py tests/unit/client/test_plain_when_faster.py"
# (run from elsewhere than /edgekit, so that the installed package is imported, not the source tree)
[ "${SKIP_TESTS:-0}" = 1 ] || step "client tests on fakes (emulated)" in_root sh -c "cd /tmp && python -m pytest -q -p no:cacheprovider \
    -c /edgekit/pyproject.toml --rootdir /edgekit -m 'not slow' -k 'not gemma and not qwen' \
    $(echo $TESTS | sed 's#tests/#/edgekit/tests/#g')" | tail -5

# 4b. end to end: the gemma draft in the root, the verifier here
PORT=${PORT:-50777}
"$REPO/.venv/bin/edgekit" serve --pair gemma-270m --port "$PORT" --threads 1 > "$WORK/verifier.log" 2>&1 &
SERVER=$!
sleep 15
PROMPT="def fibonacci(n):"
"$REPO/.venv/bin/edgekit" generate --pair gemma-270m --verifier "127.0.0.1:$PORT" --prompt "$PROMPT" \
    --max-tokens 32 --baseline target-only --json > "$WORK/target_only.json"
step "edgekit generate, 32 tokens (emulated client)" in_root env EDGEKIT_THREADS=2 \
    edgekit generate --pair gemma-270m --verifier "127.0.0.1:$PORT" --prompt "$PROMPT" --max-tokens 32 --json \
    > "$WORK/arm64.json"
"$HOST_PY" - "$WORK/target_only.json" "$WORK/arm64.json" <<'EOF'
import json, sys
ref, got = (json.load(open(p)) for p in sys.argv[1:])
same = ref["token_ids"] == got["token_ids"]
print(f"arm64 client: {len(got['token_ids'])} tokens, {got['metrics']['tokens_per_second']:.2f} tok/s (emulated), "
      f"acceptance {got['metrics']['acceptance_rate']:.2f}, identical to target-only: {same}")
sys.exit(0 if same else 1)
EOF
cat "$ROOT/timings.txt"
