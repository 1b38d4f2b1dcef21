"""The shapes of a random GGUF target (`gpu/make_target.py` writes it): the Qwen2.5 models'
dimensions in llama.cpp's terms, a toy one for the dry runs, and the tensors llama.cpp expects of a
shape, in the order they are written."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    context: int = 32768
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6


SHAPES = {  # the Qwen2.5 models' config.json, in llama.cpp's terms
    "qwen2.5-7b": Shape(n_embd=3584, n_layer=28, n_ff=18944, n_head=28, n_head_kv=4),
    "qwen2.5-14b": Shape(n_embd=5120, n_layer=48, n_ff=13824, n_head=40, n_head_kv=8),
    "qwen2.5-32b": Shape(n_embd=5120, n_layer=64, n_ff=27648, n_head=40, n_head_kv=8),
    "toy": Shape(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, context=4096),  # the dry run's
}


def tensors(shape: Shape, n_vocab: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, numpy shape, is a matrix) of every tensor, in the order written; norms and biases
    are float32, matrices float16 (numpy shapes are llama.cpp's reversed)."""
    e, kv = shape.n_embd, shape.n_embd // shape.n_head * shape.n_head_kv
    out = [("token_embd.weight", (n_vocab, e), True)]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (e,), False),
            (b + "attn_q.weight", (e, e), True), (b + "attn_q.bias", (e,), False),
            (b + "attn_k.weight", (kv, e), True), (b + "attn_k.bias", (kv,), False),
            (b + "attn_v.weight", (kv, e), True), (b + "attn_v.bias", (kv,), False),
            (b + "attn_output.weight", (e, e), True),
            (b + "ffn_norm.weight", (e,), False),
            (b + "ffn_gate.weight", (shape.n_ff, e), True),
            (b + "ffn_up.weight", (shape.n_ff, e), True),
            (b + "ffn_down.weight", (e, shape.n_ff), True),
        ]  # fmt: skip
    return out + [("output_norm.weight", (e,), False), ("output.weight", (n_vocab, e), True)]
