"""A target model where no weights can be downloaded (issue 51, item 1): a GGUF with a large
model's architecture and random weights, written with the `gguf` package, its tokenizer copied
from a model the machine has.

    python -m benchmarks gpu.make_target --shape qwen2.5-7b --out DIR                  # F16, then Q4_K_M
    python -m benchmarks gpu.make_target --shape qwen2.5-32b --types f16 --out DIR
    python -m benchmarks gpu.make_target --shape toy --tokenizer gemma-3-270m --out DIR  # what CI runs
    python -m benchmarks gpu.make_target --save-tokenizer --out DIR   # DIR/tokenizer.gguf, to carry

Shapes are the published configurations (hidden size, layers, feed-forward size, attention and
key/value heads, rope base, norm epsilon) of the Qwen2.5 models, in llama.cpp's `qwen2`
architecture: biases on q/k/v, an output matrix of its own (7B and up do not tie it to the
embedding). The vocabulary is the tokenizer's: copied whole from `--tokenizer` (a registered model
name or a GGUF path; default the qwen-coder target, Qwen2.5's tokenizer, so the qwen-coder pair's
draft drafts for it). Qwen2.5-7B's embedding has 152,064 rows, its tokenizer 151,936 tokens padded:
here the embedding has the tokenizer's rows, 0.08% fewer.

Weights are random (normal, std 0.02; norms 1): a step's time does not depend on the values, as
the roofline's random-weight decoder (`../shared/gpu/verify_roofline.py`) assumes. They are
tiled from one random block, so writing 15 GB is bound by the disk, not by the generator. A
random target accepts no draft: the timing harness replays acceptance recorded on the real pairs
(issue 51, item 2), and every figure made with this target says so.

`--types f16` writes the F16 file (2 bytes a weight, the roofline's bf16 bytes); `q4_k_m`
requantizes it with llama.cpp's quantizer (as users run models; its roofline is not the bf16 one:
a Q4_K_M step reads ~0.3x the bytes) in a child process on every core. Writes
`DIR/<shape>-random-<type>.gguf` and prints one JSON line per file: its path, type, bytes,
parameters and seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from benchmarks.rigs.target_shapes import SHAPES, tensors

_POOL = 1 << 24  # random values tiled into every weight


def _tokenizer_fields(source: Path) -> list[tuple[str, object, object, object]]:
    """Every `tokenizer.*` key of a GGUF: (key, value, value type, array element type)."""
    import gguf

    fields = []
    for key, field in gguf.GGUFReader(source).fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            fields.append((key, field.contents(), field.types[0], sub))
    return fields


def _source(tokenizer: str) -> Path:
    if tokenizer.endswith(".gguf") or os.sep in tokenizer:
        return Path(tokenizer)
    from edgekit.models import model_path

    return model_path(tokenizer)


def write_f16(shape_name: str, tokenizer: str, path: Path, seed: int = 0) -> dict:
    """The F16 GGUF of `shape_name` with `tokenizer`'s vocabulary and random weights, streamed to
    `path` tensor by tensor (memory: one tensor at a time)."""
    import gguf

    t0 = time.perf_counter()
    shape = SHAPES[shape_name]
    fields = _tokenizer_fields(_source(tokenizer))
    n_vocab = len(next(v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"))
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(_POOL, dtype=np.float32) * 0.02).astype(np.float16)
    plan = tensors(shape, n_vocab)

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(str(partial), "qwen2")
    w.add_name(f"{shape_name} (random weights, edgekit benchmarks/gpu/make_target.py)")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, dims, matrix in plan:
        dtype = np.dtype(np.float16 if matrix else np.float32)
        w.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    params = 0
    for name, dims, matrix in plan:
        n = int(np.prod(dims))
        params += n
        if matrix:
            start = int(rng.integers(_POOL))
            data = np.resize(np.roll(pool, -start), n).reshape(dims)
        elif name.endswith("norm.weight"):
            data = np.ones(dims, dtype=np.float32)
        else:
            data = pool[: n].astype(np.float32).reshape(dims)
        w.write_tensor_data(data)
    w.close()
    partial.replace(path)
    return {"path": str(path), "type": "f16", "bytes": path.stat().st_size, "parameters": params,
            "n_vocab": n_vocab, "shape": asdict(shape), "tokenizer": tokenizer,
            "seconds": round(time.perf_counter() - t0, 1)}


def save_tokenizer(tokenizer: str, path: Path) -> dict:
    """A GGUF of `tokenizer`'s keys alone (no tensors): what `--tokenizer` needs, small enough to carry
    to a machine that has no models (Qwen2.5's: a few MB, where the qwen-coder target is 1 GB)."""
    import gguf

    fields = _tokenizer_fields(_source(tokenizer))
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "qwen2")
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"path": str(path), "type": "tokenizer", "bytes": path.stat().st_size, "tokenizer": tokenizer}


def quantize(src: Path, dst: Path, ftype: str = "Q4_K_M") -> dict:
    """`src` requantized by llama.cpp into `dst` in a child process (the quantizer may abort its
    process) on every core this process may use."""
    t0 = time.perf_counter()
    child = C.module_command("benchmarks.gpu.make_target", "--quantize-child", str(src), str(dst), ftype)
    proc = subprocess.run(child, capture_output=True, text=True, timeout=3600, check=False, env=C.module_env())
    if proc.returncode != 0 or not dst.exists():
        raise SystemExit(f"llama.cpp could not quantize {src} to {ftype} (exit {proc.returncode}): "
                         f"{proc.stderr[-2000:]}")
    return {"path": str(dst), "type": ftype.lower(), "bytes": dst.stat().st_size,
            "seconds": round(time.perf_counter() - t0, 1)}


def _quantize_child(src: str, dst: str, ftype: str) -> int:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = len(os.sched_getaffinity(0))
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}")
    partial = dst + ".partial"
    status = llama_cpp.llama_model_quantize(src.encode(), partial.encode(), params)
    if status != 0:
        return 1
    os.replace(partial, dst)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--quantize-child"]:
        raise SystemExit(_quantize_child(*args[1:4]))
    ap = C.arguments(__doc__, whole_doc=True, threads=None)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    ap.add_argument("--tokenizer", default="qwen2.5-coder-1.5b-instruct",
                    help="a registered model or a GGUF path whose tokenizer the target takes")
    ap.add_argument("--types", default="f16,q4_k_m", help="f16, and q4_k_m requantized from it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="the folder the GGUFs go to")
    ap.add_argument("--save-tokenizer", action="store_true",
                    help="write only OUT/tokenizer.gguf: the tokenizer's keys, to carry where its model is not")
    a = C.parse(ap, args, machine=False)
    if a.save_tokenizer:
        print(json.dumps(save_tokenizer(a.tokenizer, a.out / "tokenizer.gguf")), flush=True)
        return
    types = [t.strip().lower() for t in a.types.split(",") if t.strip()]
    if not set(types) <= {"f16", "q4_k_m"}:
        ap.error(f"--types: f16 and q4_k_m, not {a.types!r}")
    f16 = a.out / f"{a.shape}-random-f16.gguf"
    print(json.dumps(write_f16(a.shape, a.tokenizer, f16, a.seed)), flush=True)
    if "q4_k_m" in types:
        print(json.dumps(quantize(f16, a.out / f"{a.shape}-random-q4_k_m.gguf")), flush=True)
    if "f16" not in types:
        f16.unlink()


if __name__ == "__main__":
    main()
