"""A thin, checked layer over llama-cpp-python's low-level (ctypes) API.

Both the draft runtime and the reference verifier sit on this: a loaded model
with its vocabulary (`LlamaModel`) and a context with a KV cache holding one or
more sequences (`LlamaContext`). llama.cpp failures become `ModelLoadError` or
`InferenceError` here; nothing above this module touches ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..errors import DependencyMissingError, InferenceError, KVCacheFullError, ModelLoadError
from ..protocol import Fingerprint
from ._device import physical_cores
from ._vocab import LLAMA_PADDING_ATTRS, trailing_padding

try:
    import llama_cpp as _lc
except ImportError as exc:  # pragma: no cover - exercised only without the dependency
    raise DependencyMissingError("llama-cpp-python") from exc

__all__ = ["LlamaContext", "LlamaModel", "default_threads", "env_gpu_layers", "gpu_offload"]

# GGUF's recommended sampler settings (gguf.Keys.General.SAMPLING_*) -> GenerationConfig's names
_SAMPLING_KEYS = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                  "penalty_repeat": "repetition_penalty", "penalty_last_n": "penalty_last_n"}

_backend_lock = threading.Lock()
_backend_ready = False


@_lc.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs every tensor it loads to stderr; edgekit reports its own errors.
    if os.environ.get("EDGEKIT_LLAMA_LOG"):
        os.write(2, text)


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            _lc.llama_log_set(_quiet_log, ctypes.c_void_p(0))
            _lc.llama_backend_init()
            _backend_ready = True


_amx_ok: bool | None = None


def llama_build() -> dict[str, str]:
    """llama-cpp-python's version and what its llama.cpp build uses (SIMD, BLAS, backends):
    either changes the kernels, and with them the last bits of the logits."""
    import llama_cpp

    return {
        "llama_cpp": str(getattr(llama_cpp, "__version__", "")),
        "llama_build": _lc.llama_print_system_info().decode(errors="replace"),
    }


def _extra_buffers_ok() -> bool:
    """Whether llama.cpp's extra CPU buffer types (repacked weights) may be used.

    Where the CPU backend is built with AMX (`AMX_INT8 = 1` in its system info), those
    include the AMX buffer type, whose matmul crashed (SIGSEGV in ggml_backend_amx_mul_mat)
    on the first decode on an Intel Xeon with AMX, llama-cpp-python 0.3.36, for both gemma
    models: there the weights stay in their file layout (slower, correct) unless EDGEKIT_AMX=1."""
    global _amx_ok
    if _amx_ok is None:
        built_with_amx = "AMX_INT8 = 1" in llama_build()["llama_build"]
        _amx_ok = not built_with_amx or os.environ.get("EDGEKIT_AMX", "") in ("1", "true", "yes")
    return _amx_ok


def default_threads() -> int:
    """EDGEKIT_THREADS, or the physical cores this process may use (a core's second hyperthread
    adds little to a memory-bound decode and slows the barrier every op ends with)."""
    env = os.environ.get("EDGEKIT_THREADS")
    if env:
        return max(1, int(env))
    return physical_cores()


def env_gpu_layers() -> int | None:
    """EDGEKIT_GPU_LAYERS (-1 all layers on the GPU, 0 none), or None where unset."""
    env = os.environ.get("EDGEKIT_GPU_LAYERS", "").strip()
    if not env:
        return None
    try:
        return int(env)
    except ValueError:
        raise ValueError(f"EDGEKIT_GPU_LAYERS={env!r}: expected a whole number (-1 all, 0 none)") from None


def gpu_offload() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU."""
    _init_backend()
    return bool(_lc.llama_supports_gpu_offload())


class LlamaModel:
    """Weights and vocabulary of one GGUF file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        repack: bool = True,
        vocab_only: bool = False,
        gpu_layers: int | None = None,
    ) -> None:
        """repack=False keeps weights in their file layout: slower, but the matmul
        kernels then give the same result per row whatever the batch size.
        vocab_only loads the vocabulary and metadata, no weights (for a fingerprint; n_embd is then 0).
        gpu_layers: layers offloaded to a GPU where llama.cpp was built with one (CUDA, Metal,
        Vulkan); -1 all, 0 none; None: EDGEKIT_GPU_LAYERS, else llama.cpp's default (all).
        A CPU-only build ignores it."""
        _init_backend()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        self.name = name or self.path.stem
        params = _lc.llama_model_default_params()
        params.use_mmap = True
        params.use_extra_bufts = repack and _extra_buffers_ok()
        params.vocab_only = vocab_only
        layers = gpu_layers if gpu_layers is not None else env_gpu_layers()
        if layers is not None:
            params.n_gpu_layers = layers
        self.gpu_layers = layers
        model = _lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            # A NULL here must never reach llama.cpp again: it would segfault later.
            raise ModelLoadError(f"llama.cpp could not load {self.path} (not a GGUF model, or damaged)")
        self._model = model
        self._vocab = _lc.llama_model_get_vocab(model)
        self.n_vocab = int(_lc.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(_lc.llama_model_n_embd(model))
        self.n_ctx_train = int(_lc.llama_model_n_ctx_train(model))
        self.bos = int(_lc.llama_vocab_bos(self._vocab))
        self.eos = int(_lc.llama_vocab_eos(self._vocab))
        self.add_bos = bool(_lc.llama_vocab_get_add_bos(self._vocab))
        self._fingerprint: Fingerprint | None = None
        self._eog = np.zeros(self.n_vocab, dtype=bool)
        for tok in range(self.n_vocab):
            # Cheap once per load (~0.1 s for 262k tokens) and makes is_eog a lookup.
            if _lc.llama_vocab_is_eog(self._vocab, tok):
                self._eog[tok] = True

    def close(self) -> None:
        if getattr(self, "_model", None):
            _lc.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

    # -- vocabulary ---------------------------------------------------------------

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token]) if 0 <= token < self.n_vocab else False

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (_lc.llama_token * cap)()
        n = _lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (_lc.llama_token * cap)()
            n = _lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise InferenceError(f"tokenization failed for {len(data)} bytes of text")
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        if not 0 <= token < self.n_vocab:  # llama.cpp reads past its table (a crash) rather than refuse
            raise InferenceError(f"token {token} is not in {self.name!r}'s vocabulary of {self.n_vocab}")
        buf = ctypes.create_string_buffer(64)
        n = _lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special=special) for t in tokens).decode("utf-8", errors="replace")

    def fingerprint(self) -> Fingerprint:
        """The vocabulary's fingerprint: its hash covers each token's text and attributes up to the
        trailing padding entries, which it counts (`Fingerprint.padding`)."""
        if self._fingerprint is None:

            def entry(tok: int) -> tuple[bytes, int]:
                text = _lc.llama_vocab_get_text(self._vocab, tok) or b""
                return text, int(_lc.llama_vocab_get_attr(self._vocab, tok))

            def placeholder(tok: int) -> tuple[bytes, bool]:
                text, attr = entry(tok)
                return text, bool(attr & LLAMA_PADDING_ATTRS)

            padding = trailing_padding(self.n_vocab, placeholder)
            h = hashlib.sha256()
            for tok in range(self.n_vocab - padding):
                text, attr = entry(tok)
                h.update(len(text).to_bytes(4, "little"))
                h.update(text)
                h.update(attr.to_bytes(4, "little", signed=True))
            self._fingerprint = Fingerprint(self.n_vocab, h.digest(), self.bos, self.eos, self.name, padding)
        return self._fingerprint

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = _lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            _lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    def sampling_defaults(self) -> dict[str, float]:
        """The sampler settings the GGUF recommends (`general.sampling.*`, which llama.cpp reads
        as its defaults), by `GenerationConfig` name; those it does not give are left out."""
        out: dict[str, float] = {}
        for key, name in _SAMPLING_KEYS.items():
            raw = self.meta(f"general.sampling.{key}")
            try:
                value = float(raw) if raw is not None else None
            except ValueError:
                value = None
            if value is not None and math.isfinite(value):
                out[name] = int(value) if name in ("top_k", "penalty_last_n") else value
        return out


_env_lock = threading.Lock()


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """`name` set to `value` in the process's environment for the block (None: left as it is)."""
    if value is None:
        yield
        return
    with _env_lock:
        before = os.environ.get(name)
        os.environ[name] = value
        try:
            yield
        finally:
            if before is None:
                del os.environ[name]
            else:
                os.environ[name] = before


def _greedy_chain() -> object:
    """A llama.cpp sampler chain that reduces a row to its argmax, on the backend that makes the row:
    what `LlamaContext.reduce_rows` installs. (Its multi-output candidates and logits, and its
    logit-bias sampler, gave other rows' values or failed in the vendored version: only the
    sampled token is read.)"""
    chain = _lc.llama_sampler_chain_init(_lc.llama_sampler_chain_default_params())
    _lc.llama_sampler_chain_add(chain, _lc.llama_sampler_init_greedy())
    return chain


class LlamaContext:
    """A KV cache over a model, holding up to `n_seq` independent sequences.

    `decode` runs a batch whose rows each name a sequence and a position; rows
    flagged as outputs get logits (and hidden states when embeddings are on),
    readable until the next decode.
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        n_ctx: int,
        n_batch: int = 512,
        n_seq: int = 1,
        embeddings: bool = False,
        n_threads: int | None = None,
        flash_attn: bool | None = None,
        unified: bool = False,
        outputs_per_seq: int = 1,
    ) -> None:
        """n_ctx is the total; each of the n_seq sequences gets its own stream of
        n_ctx / n_seq cells unless `unified`, where all share one pool. `outputs_per_seq`: the
        most output rows of one sequence in a decode that llama.cpp reduces (`reduce_rows`)."""
        self.model = model
        params = _lc.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.n_outputs_max_per_seq = outputs_per_seq
        threads = n_threads or default_threads()
        params.n_threads = threads
        params.n_threads_batch = threads
        params.embeddings = embeddings
        params.pooling_type = _lc.LLAMA_POOLING_TYPE_NONE
        # Rolling back to an earlier position needs the whole sliding-window
        # cache (Gemma 3 uses SWA); the pruned cache cannot undo a round.
        params.swa_full = True
        # A stream per sequence keeps each sequence's cells in position order
        # whatever the other sequences do, so its attention sums in the same
        # order every time (a shared pool interleaves cells freed by others).
        params.kv_unified = unified
        params.no_perf = True
        params.flash_attn_type = {
            None: _lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
            True: _lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: _lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[flash_attn]
        # llama.cpp reuses a call's graph for the next of the same shape, but the graph of its row
        # reductions reads each sequence's rows where that first call had them: a context that may
        # reduce rows plans every call's graph afresh (LLAMA_GRAPH_REUSE_DISABLE, read here only)
        with _env("LLAMA_GRAPH_REUSE_DISABLE", "1" if outputs_per_seq > 1 else None):
            ctx = _lc.llama_init_from_model(model._model, params)
        if not ctx:
            raise ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens for {model.name}")
        self._ctx = ctx
        self._mem = _lc.llama_get_memory(ctx)
        self.n_ctx = int(_lc.llama_n_ctx(ctx))
        self.n_ctx_seq = int(_lc.llama_n_ctx_seq(ctx))
        self.n_batch = n_batch
        self.n_seq = n_seq
        self._embeddings = embeddings
        self._batch = _lc.llama_batch_init(n_batch, 0, 1)
        self._n_outputs = 0
        self._logits_view_shape = (model.n_vocab,)
        # Row reductions run by llama.cpp (`reduce_rows`): the sampler chain of each sequence reduced;
        # chains replaced since the last decode, freed after the next.
        self._reductions: dict[int, object] = {}
        self._retired: list[object] = []

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            _lc.llama_batch_free(self._batch)
            _lc.llama_free(self._ctx)
            self._ctx = None
            for chain in [*self._retired, *self._reductions.values()]:
                _lc.llama_sampler_free(chain)
            self._retired.clear()
            self._reductions.clear()

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass

    def set_embeddings(self, on: bool) -> None:
        if on != self._embeddings:
            _lc.llama_set_embeddings(self._ctx, on)
            self._embeddings = on

    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seq_ids: Sequence[int],
        outputs: Sequence[bool],
    ) -> None:
        """One llama_decode of at most n_batch rows."""
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise ValueError(f"batch of {n} rows exceeds n_batch={self.n_batch}")
        b = self._batch
        for i in range(n):
            b.token[i] = tokens[i]
            b.pos[i] = positions[i]
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_ids[i]
            b.logits[i] = outputs[i]
        b.n_tokens = n
        rc = _lc.llama_decode(self._ctx, b)
        while self._retired and rc == 0:  # the graph just run was planned without them
            _lc.llama_sampler_free(self._retired.pop())
        if rc == 1:
            raise KVCacheFullError("no free KV cells for this batch")
        if rc != 0:
            raise InferenceError(f"llama_decode failed with code {rc}")

    def decode_sequence(self, tokens: Sequence[int], start: int, seq: int = 0, *, last_output: bool = True) -> None:
        """Appends tokens to one sequence in n_batch chunks; only the last row outputs."""
        n = len(tokens)
        for lo in range(0, n, self.n_batch):
            hi = min(n, lo + self.n_batch)
            outs = [False] * (hi - lo)
            if last_output and hi == n:
                outs[-1] = True
            self.decode(tokens[lo:hi], range(start + lo, start + hi), [seq] * (hi - lo), outs)

    def logits(self, i: int) -> np.ndarray:
        """Logits of batch row i (negative i counts outputs from the end), as a view: copy to keep."""
        ptr = _lc.llama_get_logits_ith(self._ctx, i)
        if not ptr:
            raise InferenceError(f"no logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=self._logits_view_shape)

    def output_logits(self, n: int) -> np.ndarray:
        """The last decode's `n` output rows' logits, in batch order, as one [n, n_vocab] view: copy to keep."""
        if n == 0:
            return np.empty((0, self.model.n_vocab), dtype=np.float32)
        ptr = _lc.llama_get_logits(self._ctx)
        if not ptr:
            raise InferenceError("no logits from the last decode")
        return np.ctypeslib.as_array(ptr, shape=(n, self.model.n_vocab))

    def reduce_rows(self, seq: int, on: bool) -> bool:
        """From the next decode on, llama.cpp reduces each output row of `seq` to its argmax where the
        row is made (llama.cpp's backend sampling, a greedy sampler per sequence: on a GPU only the
        id comes back to the host), read with `best`; off: whole rows again. False where llama.cpp
        cannot run it there (the rows stay whole). A change costs llama.cpp a new plan of its graph
        at the next decode: meant to stay as set for a while. Where several logits tie at the top,
        the id is the one llama.cpp's argmax kernel finds first (the CPU's: the highest)."""
        held = self._reductions.get(seq)
        if (held is not None) == on:
            return True
        # llama.cpp binds a chain to one sequence, once: each setting gets a chain of its own, and
        # the one it replaces is freed after the next decode (whose graph no longer holds it)
        chain = _greedy_chain() if on else None
        taken = bool(_lc.llama_set_sampler(self._ctx, seq, chain))
        if held is not None:
            self._retired.append(self._reductions.pop(seq))
        if chain is not None:
            if taken:
                self._reductions[seq] = chain
            else:
                self._retired.append(chain)
        return taken or not on

    def reduces(self, seq: int) -> bool:
        """Whether llama.cpp reduces `seq`'s output rows to their argmax (`reduce_rows`)."""
        return seq in self._reductions

    def best(self, i: int) -> int:
        """Batch row i's argmax as llama.cpp reduced it (`reduce_rows`); -1 where it reduced none."""
        return int(_lc.llama_get_sampled_token_ith(self._ctx, i))

    def hidden(self, i: int) -> np.ndarray:
        """Final-layer, post-norm hidden state of batch row i, as a view."""
        ptr = _lc.llama_get_embeddings_ith(self._ctx, i)
        if not ptr:
            raise InferenceError(f"no hidden state for batch row {i}: embeddings are off")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_embd,))

    def truncate(self, seq: int, length: int) -> None:
        """Drops the sequence's cells from position `length` on."""
        if not _lc.llama_memory_seq_rm(self._mem, seq, length, -1):
            raise InferenceError(f"llama.cpp could not roll sequence {seq} back to {length}")

    def remove(self, seq: int) -> None:
        _lc.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def seq_length(self, seq: int) -> int:
        """Cells the sequence holds: its largest position plus one (0 when empty)."""
        return int(_lc.llama_memory_seq_pos_max(self._mem, seq)) + 1

    def save_sequence(self, seq: int) -> np.ndarray:
        """The sequence's KV as llama.cpp serialises it (its cells, their positions and values)."""
        size = int(_lc.llama_state_seq_get_size(self._ctx, seq))
        state = np.empty(size, dtype=np.uint8)
        written = int(_lc.llama_state_seq_get_data(self._ctx, state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                                   size, seq))
        if written != size:
            raise InferenceError(f"llama.cpp wrote {written} of sequence {seq}'s {size} bytes of state")
        return state

    def load_sequence(self, state: np.ndarray, seq: int) -> None:
        """Loads a state `save_sequence` returned into sequence `seq` (which should be empty)."""
        read = int(_lc.llama_state_seq_set_data(self._ctx, state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                                state.nbytes, seq))
        if read == 0:
            raise KVCacheFullError(f"llama.cpp could not load {state.nbytes} bytes of state into sequence {seq}")
