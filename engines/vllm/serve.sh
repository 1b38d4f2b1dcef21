#!/usr/bin/env bash
# Starts vLLM's OpenAI-compatible server (prepared by prepare.sh) on loopback, in the foreground:
#   engines/vllm/serve.sh PORT [more vLLM flags]
# edgekit then verifies against it as openai+http://127.0.0.1:PORT/v1. Ready in ~2 min on 2 cores
# (poll /v1/models), ~8 GB RSS across its processes; the first request after a start is slow (~30 s).
# From Python: benchmarks/rigs/vllm_server.py (VllmServer) starts it, waits for it and stops it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
port="${1:?usage: serve.sh PORT [vLLM flags]}"
shift
if [ ! -f "$VLLM_MODEL_DIR/.edgekit-converted" ]; then
    echo "no converted target in $VLLM_MODEL_DIR: run engines/vllm/prepare.sh" >&2
    exit 2
fi
# One OpenMP thread, not bound to a core: this machine's two cores are shared with the draft and
# other jobs, and vLLM's default binding claims cores for itself.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
# The KV cache in GiB (vLLM's CPU default is 4): 2 holds 4096 tokens of gemma-3-270m many times over.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
# Local files only, and no usage report: tests run without a network.
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# `python -m`, not the `vllm` command: that fails (PackageNotFoundError: vllm), the distribution
# being named vllm-cpu. --dtype float32: the converted weights are float32 (the CPU build would
# otherwise pick bfloat16 and round them). --enforce-eager: no graph capture to wait for.
# --max-logprobs 20 is vLLM's default cap, said here because edgekit's top-k sampling stays within it.
# --enable-scale-out: the token-in/token-out /inference/v1/generate, a round in one request that reads
# the prefix cache (edgekit's "generate" route). --block-size 16: the prefix cache keeps whole KV blocks
# only, so each round computes the context's tail past the last full block again; the CPU build's
# default block (128 for gemma-3) made rounds at 127 tokens cost 6x those at 128, and it raises 16
# to 32 (the CPU attention's least), which bounds the tail to 31 tokens. --enable-prompt-tokens-details:
# each answer says how many tokens came from the cache, so a round knows its block's rows were computed.
exec "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$VLLM_MODEL_DIR" --served-model-name "$VLLM_SERVED_NAME" \
    --host 127.0.0.1 --port "$port" --dtype float32 --max-model-len 4096 --enforce-eager \
    --max-logprobs 20 --enable-scale-out --enable-prompt-tokens-details --block-size 16 "$@"
