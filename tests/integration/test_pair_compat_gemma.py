"""The padded pair end to end, on the real gemma files: gemma-3-270m Q4_K_M against a copy of
itself padded as llama.cpp's converter pads (128 "[PAD<id>]" entries of token type UNUSED, and 128
zero rows in its tied token embedding; llama.cpp loads it as a 262,272-entry model). The headers
check lossless, speculation on it is its own greedy decoding and commits no padding id, and a
mismatched pair is refused before any weights load. The header rules themselves are unit tests
(tests/unit/models/test_pair_compat.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from edgekit import EdgeClient, GenerationConfig, ServerConfig
from edgekit.errors import IncompatibleModelsError
from edgekit.models.compat import check_pair, require_pair
from edgekit.runtime import LlamaContext, LlamaModel
from edgekit.verifier import VerifierServer

UNUSED, USER_DEFINED, NORMAL, CONTROL = (
    gguf.TokenType.UNUSED, gguf.TokenType.USER_DEFINED, gguf.TokenType.NORMAL, gguf.TokenType.CONTROL
)


# -- the real pair: gemma-3-270m against a padded copy of itself -------------------------------

EXTRA = 128  # padding entries the copy adds (Qwen2.5 7B has 128 more than 0.5B)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 5, 8, 13,", "Le chat est assis sur"]


def pad_gguf(src: Path, dst: Path, extra: int) -> Path:
    """A copy of the GGUF at `src` whose vocabulary has `extra` padding entries more, as llama.cpp's
    converter writes them ("[PAD<id>]", UNUSED, score -1000), and whose token embedding has as many
    zero rows more (whole blocks of its quantization type: all-zero bytes decode to 0 in each).
    For a model whose output is tied to its token embedding (gemma), as llama.cpp's
    gguf_new_metadata copies a file."""
    reader = gguf.GGUFReader(src)
    n = len(reader.fields[gguf.Keys.Tokenizer.LIST].data)
    more = {
        gguf.Keys.Tokenizer.LIST: [f"[PAD{n + i}]" for i in range(extra)],
        gguf.Keys.Tokenizer.TOKEN_TYPE: [int(UNUSED)] * extra,
        gguf.Keys.Tokenizer.SCORES: [-1000.0] * extra,
    }
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer's own
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(field.name, value + more.get(field.name, []) if sub else value, kind, sub_type=sub)
    data = {t.name: t.data for t in reader.tensors}
    embd = data["token_embd.weight"]  # [rows, bytes per row] of quantized blocks
    assert "output.weight" not in data and embd.shape[0] == n
    data["token_embd.weight"] = np.concatenate([embd, np.zeros((extra, embd.shape[1]), dtype=embd.dtype)])
    for t in reader.tensors:
        d = data[t.name]
        writer.add_tensor_info(t.name, d.shape, d.dtype, d.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(data[t.name])
    writer.close()
    return dst


@pytest.fixture(scope="module")
def padded_target(gemma_paths, tmp_path_factory):
    return pad_gguf(gemma_paths[1], tmp_path_factory.mktemp("padded") / "gemma-3-270m-padded.gguf", EXTRA)


@pytest.fixture(scope="module")
def padded_server(padded_target):
    config = ServerConfig(port=0, max_sessions=2, max_context=512, max_block=8)
    server = VerifierServer(padded_target, config, name="gemma-3-270m-padded").start()
    yield server
    server.stop()


def test_the_padded_pair_checks_lossless_from_its_headers(gemma_paths, padded_target, gemma_draft):
    check = check_pair(gemma_paths[0], padded_target, draft_name="gemma-3-270m-q4_0", target_name="padded")
    assert check.compatible and check.lossless and check.padding == EXTRA
    assert check.reason == (
        "draft gemma-3-270m-q4_0 and target padded share a tokenizer (262,144 tokens, SentencePiece model "
        "'llama'); padded has 128 more padding entries than gemma-3-270m-q4_0 (262,272 vs 262,144), which are "
        "never drafted or committed: lossless"
    )
    # llama.cpp reads the same vocabulary: 262,272 entries, 128 of them padding, the draft's tokens.
    vocab = LlamaModel(padded_target, vocab_only=True)
    fp = vocab.fingerprint()
    vocab.close()
    assert (fp.vocab_size, fp.padding) == (262_144 + EXTRA, EXTRA)
    assert fp.same_tokenizer(gemma_draft.fingerprint()) and gemma_draft.fingerprint().padding == 0


def _full_vocabulary_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    """The model's own greedy decoding over all of its logits, padding columns included, one row
    at a time as the verifier's target-only decoding runs (exact numerics: no repacking, flash
    attention), checking that the padding columns are zero (zero rows of the tied embedding)."""
    model = LlamaModel(path, repack=False)
    ctx = LlamaContext(model, n_ctx=256, flash_attn=True)
    try:
        ctx.decode_sequence(prompt[:-1], 0, 0, last_output=False)
        out, last = [], prompt[-1]
        for pos in range(len(prompt) - 1, len(prompt) - 1 + n):
            ctx.decode([last], [pos], [0], [True])
            logits = ctx.logits(0)
            assert logits.shape == (262_144 + EXTRA,) and not logits[262_144:].any()
            last = int(np.argmax(logits))
            out.append(last)
            if model.is_eog(last):
                break
        return out
    finally:
        ctx.close()
        model.close()


def test_greedy_speculation_on_the_padded_target_is_its_own_decoding(padded_server, padded_target, gemma_draft):
    """The gemma draft (262,144 entries) against a verifier serving the padded target (262,272):
    the speculative output equals the verifier's target-only decoding and the padded model's own
    greedy decoding over all its logits (where the zero padding columns never win)."""
    assert padded_server.service.engine.n_vocab == 262_144 + EXTRA
    generation = GenerationConfig(max_tokens=24, drafting="fixed", draft_k=4)
    with EdgeClient(padded_server.address, draft=gemma_draft, generation=generation) as client:
        assert client.server_info().target_fingerprint.vocab_size == 262_144 + EXTRA
        accepted = 0
        for prompt in PROMPTS:
            tokens = client.tokenize(prompt)
            spec = client.generate(tokens).until_done()
            alone = client.generate_target_only(tokens).until_done()
            assert list(spec.token_ids) == list(alone.token_ids), prompt
            assert list(spec.token_ids) == _full_vocabulary_greedy(padded_target, tokens, 24)[: len(spec.token_ids)]
            accepted += spec.stats.accepted
    assert accepted > 0  # it really speculated


def test_a_mismatched_pair_is_refused_before_any_weights_load(gemma_paths, monkeypatch):
    """gemma's draft for SmolLM2: refused from the headers, naming both, with llama.cpp never asked
    to load a model."""
    from edgekit.models import model_path
    from edgekit.runtime import _llama  # private: llama.cpp's loads counted where they happen

    loads: list[bytes] = []
    monkeypatch.setattr(_llama._lc, "llama_model_load_from_file", lambda path, params: loads.append(path))
    with pytest.raises(IncompatibleModelsError) as info:
        require_pair(gemma_paths[0], model_path("smollm2-135m-instruct"), draft_name="gemma-3-270m-q4_0",
                     target_name="smollm2-135m-instruct")
    assert str(info.value) == (
        "draft gemma-3-270m-q4_0 cannot draft for target smollm2-135m-instruct: their tokenizers differ "
        "(tokenizer model 'llama' in gemma-3-270m-q4_0, 'gpt2' in smollm2-135m-instruct; 262,144 and 49,152 "
        "entries); use a draft from the target's family"
    )
    assert not loads  # refused from the headers: llama.cpp never asked to load a model
