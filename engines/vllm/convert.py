"""Converts a GGUF model to float32 safetensors that vLLM's CPU build can serve; run with the
vLLM venv's Python (it has transformers, torch, gguf and accelerate): prepare.sh does.

    python convert.py MODEL.gguf OUT_DIR

vLLM reads GGUF only through `vllm-gguf-plugin`, which needs CUDA; transformers reads it on
CPU and dequantizes it. The weights become float32, not llama.cpp's quantized kernels, so
this target is compared with vLLM's own decoding, never with llama.cpp's (they differ in
near-ties: 0.256 and 0.029 nats were seen on gemma-3-270m).
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    # The weights are dequantized already, but the model still names the GGUF quantizer, and
    # save_pretrained refuses ("model is quantized with QuantizationMethod.GGUF and is not
    # serializable"): forget it, on the model and in the config that is saved beside it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    # The tokenizer as transformers reads it from the GGUF. It does not add the BOS that the GGUF
    # asks for (add_bos_token); it is left so on purpose: edgekit sends token-id prompts with its
    # own BOS and its tokenizer check tells that convention apart from another vocabulary.
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
