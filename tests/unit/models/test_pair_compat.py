"""Whether a draft can serve a target, from the GGUF headers alone (`edgekit.models.compat`), and the
padded pair end to end: a target whose vocabulary has more padding entries than its draft's
verifies losslessly, and no padding id is ever committed.

The files are written with the `gguf` package's GGUFWriter, as llama.cpp's converter writes them:
padding entries are "[PAD<id>]" of token type UNUSED (convert_hf_to_gguf.py's `get_vocab_base`;
older conversions: USER_DEFINED; its SentencePiece path numbers them "[PAD1]", "[PAD2]", ...).
The real pair pads gemma-3-270m Q4_K_M: 128 entries more in its tokenizer and 128 zero rows
more in its tied token embedding, which llama.cpp loads as a 262,272-entry model.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from http_fakes import FakeSGLangServer
from scipy.stats import chisquare

from edgekit import ClientConfig, EdgeClient, GenerationConfig, ServerConfig
from edgekit.errors import IncompatibleModelsError, ModelLoadError, ProtocolError
from edgekit.models.compat import check_pair, require_pair, tokenizer_of
from edgekit.protocol import BlockRequest, Sampler, fingerprint_from_pb, fingerprint_to_pb
from edgekit.testing import FakeDraftModel, InProcessTransport, ToyLanguageModel
from edgekit.verifier import ToyEngine, VerifierService

# private: the verifier's semantic mode built from the pair's headers
from edgekit.verifier._semantic import SemanticMode

UNUSED, USER_DEFINED, NORMAL, CONTROL = (
    gguf.TokenType.UNUSED, gguf.TokenType.USER_DEFINED, gguf.TokenType.NORMAL, gguf.TokenType.CONTROL
)
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "ab", "abc", "Ġthe", "Ġa"]
TYPES = [CONTROL, CONTROL, CONTROL] + [NORMAL] * 7
MERGES = ["a b", "ab c", "Ġ t", "Ġt he"]
SPECIAL = {"bos": 0, "eos": 2, "pad": 0, "unk": 0, "eot": 2}


def write_gguf(
    path: Path,
    *,
    tokens: list[str] = TOKENS,
    types: list[int] = TYPES,
    merges: list[str] | None = MERGES,
    model: str = "gpt2",
    pre: str = "qwen2",
    special: dict[str, int] = SPECIAL,
    padding: int = 0,
    pad_type: int = UNUSED,
    tensor: np.ndarray | None = None,
) -> Path:
    """A tokenizer-only GGUF (or one with `tensor` as its token embedding), `padding` entries
    "[PAD<id>]" at the end as llama.cpp's converter writes them."""
    n = len(tokens)
    tokens = tokens + [f"[PAD{n + i}]" for i in range(padding)]
    types = types + [pad_type] * padding
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    adders = {"bos": w.add_bos_token_id, "eos": w.add_eos_token_id, "pad": w.add_pad_token_id,
              "unk": w.add_unk_token_id, "eot": w.add_eot_token_id}
    for role, token in special.items():
        adders[role](token)
    if tensor is not None:
        w.add_tensor("token_embd.weight", tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def draft(tmp_path):
    return write_gguf(tmp_path / "draft.gguf")


def test_the_same_tokenizer_is_a_lossless_pair(draft, tmp_path):
    target = write_gguf(tmp_path / "target.gguf")
    check = check_pair(draft, target, draft_name="qwen-0.5b", target_name="qwen-7b")
    assert check.compatible and check.lossless and check.padding == 0
    assert check.reason == (
        "draft qwen-0.5b and target qwen-7b share a tokenizer (10 tokens, BPE model 'gpt2'): lossless"
    )
    assert require_pair(draft, target) == check_pair(draft, target)  # names default to the file names
    assert check_pair(draft, target).draft == "draft.gguf"


@pytest.mark.parametrize(
    "draft_padding, target_padding, pad_type",
    [(0, 8, UNUSED), (4, 12, UNUSED), (12, 4, UNUSED), (0, 8, USER_DEFINED)],
)
def test_vocabularies_that_differ_only_in_trailing_padding_are_a_lossless_pair(
    tmp_path, draft_padding, target_padding, pad_type
):
    """Qwen2.5's case (0.5B: 151,936 entries, 7B: 152,064, over the same 151,665 tokens), both
    ways round, with the padding typed UNUSED (llama.cpp today) or USER_DEFINED (older conversions)."""
    d = write_gguf(tmp_path / "d.gguf", padding=draft_padding, pad_type=pad_type)
    t = write_gguf(tmp_path / "t.gguf", padding=target_padding, pad_type=pad_type)
    check = check_pair(d, t, draft_name="small", target_name="large")
    assert check.compatible and check.lossless and check.padding == 8
    more, fewer = ("large", "small") if target_padding > draft_padding else ("small", "large")
    assert f"{more} has 8 more padding entries than {fewer} (" in check.reason
    assert check.reason.endswith("which are never drafted or committed: lossless")
    a, b = tokenizer_of(d), tokenizer_of(t)
    assert (a.padding, b.padding, a.real_size, b.real_size) == (draft_padding, target_padding, 10, 10)
    assert a.vocab_hash == b.vocab_hash and a.tokenizer_hash == b.tokenizer_hash


def test_sentencepiece_padding_numbered_from_one_is_padding_too(tmp_path):
    """convert_hf_to_gguf.py's SentencePiece path writes "[PAD1]", "[PAD2]", ... (type UNUSED)."""
    spm = ["<unk>", "<s>", "</s>", "▁a", "▁b"]
    plain = write_gguf(tmp_path / "plain.gguf", tokens=spm, types=[2, 3, 3, 1, 1], merges=None, model="llama",
                       pre="default", special={"bos": 1, "eos": 2, "unk": 0})
    padded = tmp_path / "padded.gguf"
    write_gguf(padded, tokens=spm + ["[PAD1]", "[PAD2]"], types=[2, 3, 3, 1, 1, UNUSED, UNUSED], merges=None,
               model="llama", pre="default", special={"bos": 1, "eos": 2, "unk": 0})
    check = check_pair(plain, padded)
    assert check.lossless and check.padding == 2 and tokenizer_of(padded).padding == 2


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"tokens": TOKENS[:6] + ["xy"] + TOKENS[7:]}, "token 6 is 'ab' in small, 'xy' in large"),
        ({"types": TYPES[:4] + [USER_DEFINED] + TYPES[5:]},
         "token 4 ('b') is of type normal in small, user-defined in large"),
        ({"special": {**SPECIAL, "eos": 1}}, "eos token 2 ('<|im_end|>') in small, 1 ('<|im_start|>') in large"),
        ({"special": {k: v for k, v in SPECIAL.items() if k != "eot"}},
         "eot token 2 ('<|im_end|>') in small, not set in large"),
        ({"merges": MERGES[:2] + ["Ġ th", "Ġth e"]}, "BPE merge 2 is 'Ġ t' in small, 'Ġ th' in large"),
        ({"merges": MERGES[:3]}, "4 BPE merges in small, 3 in large"),
        ({"model": "llama"}, "tokenizer model 'gpt2' in small, 'llama' in large; 10 and 10 entries"),
        ({"tokens": TOKENS + ["<|new|>"], "types": TYPES + [CONTROL]},
         "large has 11 tokens, small 10, and token 10 ('<|new|>' of type control) is no padding"),
        ({"tokens": TOKENS + ["[PAD10]"], "types": TYPES + [NORMAL]},  # the text alone makes no padding
         "large has 11 tokens, small 10, and token 10 ('[PAD10]' of type normal) is no padding"),
    ],
)
def test_anything_else_is_refused_naming_both_models_and_what_differs(tmp_path, draft, change, expected):
    target = write_gguf(tmp_path / "target.gguf", **change)
    check = check_pair(draft, target, draft_name="small", target_name="large")
    assert not check.compatible and not check.lossless and check.padding == 0
    assert check.reason == (
        f"draft small cannot draft for target large: their tokenizers differ ({expected}); "
        "use a draft from the target's family"
    )
    with pytest.raises(IncompatibleModelsError) as info:
        require_pair(draft, target, draft_name="small", target_name="large")
    assert str(info.value) == check.reason


def test_a_different_pre_tokenizer_name_alone_is_said_but_not_refused(draft, tmp_path):
    """Ids mean the same text on both sides; the device splits text with its own tokenizer."""
    target = write_gguf(tmp_path / "target.gguf", pre="gpt2")
    check = check_pair(draft, target)
    assert check.lossless
    assert "their pre-tokenizers are named differently ('qwen2' vs 'gpt2'): text is split by the draft's" in (
        check.reason
    )


def test_files_without_a_readable_tokenizer_are_a_clear_error(tmp_path, draft):
    with pytest.raises(ModelLoadError, match="model file not found"):
        check_pair(tmp_path / "absent.gguf", draft)
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        check_pair(draft, tmp_path / "text.gguf")
    w = gguf.GGUFWriter(tmp_path / "bare.gguf", "qwen2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="holds no tokenizer"):
        tokenizer_of(tmp_path / "bare.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(draft.read_bytes()[:-40])  # the merges run past the end
    with pytest.raises(ModelLoadError, match="damaged GGUF metadata"):
        tokenizer_of(cut)


def test_no_tensor_data_is_read(tmp_path):
    """A model's header alone answers: the file cut where its tensor data begins reads the same,
    and one whose data is 64 GiB (a sparse file: reading it would take minutes) reads as fast."""
    embd = np.ones((len(TOKENS), 256), dtype=np.float32)
    model = write_gguf(tmp_path / "model.gguf", tensor=embd)
    whole = tokenizer_of(model)
    data_at = os.path.getsize(model) - embd.nbytes
    assert model.read_bytes()[data_at:] == embd.tobytes()
    headless = tmp_path / "header-only.gguf"
    headless.write_bytes(model.read_bytes()[:data_at])
    assert tokenizer_of(headless).tokenizer_hash == whole.tokenizer_hash  # so no tensor byte is read


# -- the runtime side, on toys: fingerprints, verification, target-only decoding ---------------

V = 8  # the toys' tokens; a padded toy has PAD entries more
PAD = 4


class FeedRecordingEngine(ToyEngine):
    """A toy engine that keeps every token it was fed."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fed: list[int] = []

    def run_batch(self, feeds):  # type: ignore[no-untyped-def]
        self.fed += [t for f in feeds for t in f.tokens]
        return super().run_batch(feeds)


def _padded_pair(side: str, padding_logit: float, *, noise: float = 0.0) -> tuple[ToyLanguageModel, ToyLanguageModel]:
    """(target, draft) over the same V tokens, `side` ("target" or "draft") with PAD padding
    entries more, whose logits are `padding_logit` (0: what zero rows give; 50: always its top-1)."""
    padded = {"vocab_size": V + PAD, "padding": PAD, "padding_logit": padding_logit}
    target = ToyLanguageModel(**(padded if side == "target" else {"vocab_size": V}), seed=4, eos_bias=-8.0)
    draft = ToyLanguageModel(**(padded if side == "draft" else {"vocab_size": V}), seed=4, eos_bias=-8.0, noise=noise)
    return target, draft


def _client_of(target: ToyLanguageModel, draft: ToyLanguageModel, **generation) -> EdgeClient:  # type: ignore[no-untyped-def]
    config = ServerConfig(port=0, max_block=16, max_context=512, max_sessions=4)
    engine = FeedRecordingEngine(target, n_seq=config.max_sessions, max_context=config.max_context)
    return EdgeClient(
        InProcessTransport(VerifierService(engine, config)),
        draft=FakeDraftModel(draft),
        generation=GenerationConfig(**({"drafting": "fixed", "draft_k": 4, "stop_at_eos": False} | generation)),
    )


def test_fingerprints_of_vocabularies_that_differ_in_padding_share_a_tokenizer():
    plain, padded = ToyLanguageModel(V), ToyLanguageModel(V + PAD, padding=PAD)
    a, b = plain.fingerprint(), padded.fingerprint()
    assert (a.vocab_size, b.vocab_size, a.padding, b.padding, b.real_vocab_size) == (V, V + PAD, 0, PAD, V)
    assert a.same_tokenizer(b) and b.same_tokenizer(a)
    assert not ToyLanguageModel(V + PAD).fingerprint().same_tokenizer(a)  # 12 tokens are not 8 and padding
    assert padded.logits([0, 3])[:V].tolist() == plain.logits([0, 3]).tolist()
    # On the wire the hash travels as it is; the padding count is each end's own.
    back = fingerprint_from_pb(fingerprint_to_pb(b))
    assert back.same_tokenizer(a) and (back.vocab_size, back.padding) == (V + PAD, 0)


@pytest.mark.parametrize("side", ["target", "draft"])
@pytest.mark.parametrize("padding_logit", [0.0, 50.0])
def test_a_padded_pair_decodes_greedily_as_the_target_and_never_commits_padding(side, padding_logit):
    """Either side may have the padding. With logits of 0 (zero rows) the padding is never a
    model's top-1; with 50 it always is, the worst case: a padded target is judged over its tokens
    (its own target-only decoding too), and a padded draft's padding proposals are rejected, the
    target never running them."""
    target, draft = _padded_pair(side, padding_logit, noise=1.0)
    with _client_of(target, draft, max_tokens=40) as client:
        prompt = client.tokenize("speculate")
        spec = client.generate(prompt).until_done()
        alone = client.generate_target_only(prompt, max_tokens=40).until_done()
        engine = client.transport.service.engine
    assert list(spec.token_ids) == list(alone.token_ids) == target.greedy(prompt, 40)
    assert max(spec.token_ids) < V and max(engine.fed) < V
    if side == "draft" and padding_logit:
        assert spec.stats.accepted == 0 and spec.stats.rounds == 40  # every proposal was padding
    else:
        assert spec.stats.accepted > 0


@pytest.mark.parametrize("side", ["target", "draft"])
def test_a_padded_pair_samples_as_the_target_over_its_tokens(side):
    """Speculative sampling stays lossless: the first token after a prompt, over 600 seeds, is
    distributed as the target's softmax over its tokens (chi-square at 0.001), whichever side has
    the padding, the padding given real mass (logit 2 against N(0, 3) tokens, at temperature 8: a third of
    the padded side's probability)."""
    target, draft = _padded_pair(side, 2.0, noise=1.5)
    with _client_of(target, draft, max_tokens=1, mode="sample", temperature=8.0, draft_top_k=V + PAD) as client:
        prompt = client.tokenize("sample")
        firsts = [client.generate(prompt, seed=seed).until_done().token_ids[0] for seed in range(600)]
        alone = [client.generate_target_only(prompt, seed=seed).until_done().token_ids[0] for seed in range(300)]
    assert max(firsts) < V and max(alone) < V
    p = Sampler(temperature=8.0).probs(target.logits(prompt)[:V])
    assert p.min() * 300 > 5  # every cell expects enough draws for the test to hold
    for seen in (firsts, alone):
        counts = np.bincount(seen, minlength=V)
        assert chisquare(counts, p * len(seen)).pvalue > 1e-3, (counts, p)


def test_the_verifier_takes_the_padding_of_the_draft_it_was_opened_with():
    """A draft token past the draft's own vocabulary is a protocol error; one past the target's
    (a padding entry only the draft has) is a draft token like another, and rejected."""
    target, draft = _padded_pair("draft", 0.0)
    with _client_of(target, draft) as client:
        session = client.session()
        session.open(client.tokenize("hi"))
        t = client.transport
        with pytest.raises(ProtocolError, match=f"outside the vocabulary of {V + PAD}"):
            t.verify(BlockRequest(session_id=session.session_id, base_position=len(session.tokens),
                                  draft_tokens=[3, V + PAD]))
        verdict = t.verify(BlockRequest(session_id=session.session_id, base_position=len(session.tokens),
                                        draft_tokens=[V + 1, 3]))
        assert verdict.accepted == 0 and verdict.next_token < V and not verdict.bonus


class _AcceptingHead:
    """A decision head that would accept every mismatch."""

    identity, threshold, draft_hidden, target_hidden = "accept-all", 1.0, 4, 4

    def check_pair(self, draft_hidden: int, target_hidden: int) -> None:
        pass

    def p_reject(self, h_draft, h_target, link, logits=None, draft_tokens=None):  # type: ignore[no-untyped-def]
        assert draft_tokens is None or max(draft_tokens) < logits.shape[1]  # it never reads a padding id
        return np.zeros(len(h_draft))


def test_semantic_mode_never_accepts_a_padding_id_whatever_its_head_says():
    mode = SemanticMode(_AcceptingHead(), 4)
    logits = np.zeros((4, V), dtype=np.float32)
    logits[:, 5] = 1.0  # the target's top-1 is 5 everywhere
    rows = ((0, 1, 2), np.zeros((3, 4), np.float32))
    hidden = np.zeros((4, 4), np.float32)
    # mismatches at 0 (accepted by the head) and 1 (padding: rejected at threshold 1, where the head rejects nothing)
    assert mode.decide(logits[:3], [2, V + 1, 6], rows, hidden[:3], 1.0, None) == (1, 5, 1)
    assert mode.decide(logits, [2, 3, 6], rows, hidden, 1.0, None) == (3, 5, 3)


def test_a_stock_server_choosing_a_token_the_draft_lacks_is_a_clear_error():
    """SGLang's server judges over every entry of its vocabulary: a target that prefers its padding
    names an id the draft does not have, which the client refuses to commit."""
    target, draft = _padded_pair("target", 50.0)
    fake = FakeDraftModel(draft)
    with FakeSGLangServer(target, lambda t: fake.token_bytes(t).decode()) as server:
        config = GenerationConfig(max_tokens=8, stop_at_eos=False, drafting="fixed", draft_k=2)
        with EdgeClient(f"sglang+{server.url}", draft=fake, generation=config,
                        config=ClientConfig(timeout=30)) as client:
            with pytest.raises(ProtocolError, match=f"chose token {V}, outside the draft's {V}-token vocabulary"):
                client.generate("hi").until_done()
