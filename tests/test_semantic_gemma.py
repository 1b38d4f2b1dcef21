"""Semantic mode on the real gemma pair: the engine's hidden rows leave the logits as they were,
the mode runs end to end through gRPC with a head of the pair's widths, and the task-outcome
labeller continues from the right prefix at every mismatch."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit import ClientConfig, EdgeClient, GenerationConfig, ServerConfig
from edgekit.runtime import LlamaContext, LlamaModel
from edgekit.testing import link_only_head
from edgekit.transport import GrpcTransport
from edgekit.verifier import VerifierServer
from edgekit.verifier.engine import Feed, LlamaEngine

pytestmark = pytest.mark.models

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def test_hidden_rows_come_from_the_same_pass_and_change_no_logit(gemma_paths):
    engine = LlamaEngine(str(gemma_paths[1]), max_context=256, n_seq=2, max_block=8)
    try:
        tokens = tuple(engine.model.tokenize(PROMPT))
        head, block = tokens[:-6], tokens[-6:]
        for seq in (0, 1):
            engine.run_batch([Feed(seq, 0, head, 0)])
        plain, with_hidden = engine.run_batch(
            [Feed(0, len(head), block, len(block)), Feed(1, len(head), block, len(block), hidden=True)]
        )
        assert isinstance(plain, np.ndarray) and isinstance(with_hidden, tuple)
        logits, hidden = with_hidden
        assert np.array_equal(logits, plain)  # exact mode: bit for bit, hidden states or not
        assert hidden.shape == (len(block), engine.n_embd) and np.all(np.isfinite(hidden))
        # the rows are the model's final-layer, post-norm states: a context decoding the same tokens agrees
        ctx = LlamaContext(engine.model, n_ctx=256, embeddings=True, flash_attn=True)
        ctx.decode_sequence(head, 0, 0, last_output=False)
        ctx.decode(block, range(len(head), len(tokens)), [0] * len(block), [True] * len(block))
        ref = np.stack([ctx.hidden(i).copy() for i in range(len(block))])
        ctx.close()
        cos = np.sum(ref * hidden, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(hidden, axis=1))
        assert cos.min() > 0.999
    finally:
        engine.close()


@pytest.fixture(scope="module")
def semantic_server(gemma_paths, tmp_path_factory):
    path = tmp_path_factory.mktemp("head") / "gemma-link.onnx"
    link_only_head(path, draft_hidden=640, target_hidden=640, pair="gemma-270m")
    config = ServerConfig(port=0, max_sessions=4, max_context=1024, max_block=16, semantic_head=str(path))
    server = VerifierServer(gemma_paths[1], config, name="gemma-3-270m").start()
    yield server
    server.stop()


def _run(server, draft, **gen):
    config = GenerationConfig(**({"max_tokens": 48, "drafting": "fixed", "draft_k": 6, "stop_at_eos": False} | gen))
    with EdgeClient(GrpcTransport(server.address, ClientConfig(timeout=60)), draft_model=draft,
                    generation=config) as client:
        return client.generate(PROMPT).until_done()


def test_semantic_mode_end_to_end_on_gemma(semantic_server, gemma_draft):
    greedy = _run(semantic_server, gemma_draft)
    strict = _run(semantic_server, gemma_draft, mode="semantic", upload="fh", semantic_threshold=0.0)
    assert strict.token_ids == greedy.token_ids and strict.stats.semantic_accepted == 0
    lenient = _run(semantic_server, gemma_draft, mode="semantic", upload="sh", semantic_threshold=1.0)
    assert lenient.stats.semantic_accepted > 0 and lenient.stats.accepted == lenient.stats.drafted
    assert lenient.stats.rounds < greedy.stats.rounds
    assert lenient.stats.semantic_head.startswith("gemma-link:")
    snap = semantic_server.service.stats.snapshot()
    assert snap.semantic_accepted >= lenient.stats.semantic_accepted


def test_labels_continue_from_the_reference_prefix(gemma_paths, tmp_path):
    """Each label's continuation equals a fresh greedy decode of the reference prefix and the draft's
    token, for every mismatch of an episode (a continuation must not leak into the next one's prefix)."""
    from edgekit.semantic.collect import TraceSet, collect, label
    from edgekit.semantic.tasks import Task

    task = Task("toy/fib", PROMPT, lambda text: "return" in text, ("\ndef ",), 40)
    out = tmp_path / "traces"
    collect([task], gemma_paths[0], gemma_paths[1], out, pair="gemma-270m", n_ctx=512, log=lambda _: None)
    added = label([task], gemma_paths[1], out, n_ctx=512, log=lambda _: None)
    ts = TraceSet(out)
    rows = ts.rows(0)
    assert added == len(rows["positions"]) >= 2  # several mismatches: the KV is reused between them
    answer = ts.episodes[0]["answer"]
    model = LlamaModel(gemma_paths[1])
    prompt = model.tokenize(PROMPT)
    labels = ts.labels()
    for pos, tok in zip(rows["positions"], rows["draft_tokens"]):
        ctx = LlamaContext(model, n_ctx=512)
        seq = [*prompt, *answer[:pos], int(tok)]
        ans = [*answer[:pos], int(tok)]
        ctx.decode_sequence(seq, 0, 0)
        n = 0
        while len(ans) < 40:
            nxt = int(np.argmax(ctx.logits(-1)))
            n += 1
            ans.append(nxt)
            if model.is_eog(nxt) or "\ndef " in model.detokenize(ans[-24:]):
                break
            ctx.decode([nxt], [len(seq)], [0], [True])
            seq.append(nxt)
        ctx.close()
        assert labels[(0, int(pos))]["continuation"] == n, pos


def test_traces_keep_the_targets_confidence_and_add_it_to_older_ones(gemma_paths, tmp_path):
    """Each mismatch's target features are the target's own distribution after the reference prefix,
    and an episode traced without them (before they were kept) gets them on the next collect."""
    from edgekit.semantic.collect import TraceSet, collect
    from edgekit.semantic.confidence import TARGET_FEATURES, target_features
    from edgekit.semantic.tasks import Task

    task = Task("toy/fib", PROMPT, lambda text: "return" in text, ("\ndef ",), 40)
    out = tmp_path / "traces"
    collect([task], gemma_paths[0], gemma_paths[1], out, pair="gemma-270m", n_ctx=512, log=lambda _: None)
    rows = TraceSet(out).rows(0)
    feats = rows["target_features"]
    assert feats.shape == (len(rows["positions"]), len(TARGET_FEATURES)) and len(feats) >= 2
    answer = TraceSet(out).episodes[0]["answer"]
    model = LlamaModel(gemma_paths[1])
    prompt = model.tokenize(PROMPT)
    for pos, tok, got in zip(rows["positions"], rows["draft_tokens"], feats):
        ctx = LlamaContext(model, n_ctx=512)
        ctx.decode_sequence([*prompt, *answer[:pos]], 0, 0)
        want = target_features(ctx.logits(-1)[None, :], [int(tok)])[0]
        ctx.close()
        assert np.allclose(got, want, atol=0.05), (pos, got, want)  # batched against one row: not bit-exact
        assert got[3] > 0 and got[1] > got[2]  # a mismatch: the target preferred its own token
    # an episode from before: its features are added on the next run, the rest of it unchanged
    npz = out / "episodes" / "0.npz"
    np.savez_compressed(npz, **{k: v for k, v in rows.items() if k != "target_features"})
    log: list[str] = []
    collect([task], gemma_paths[0], gemma_paths[1], out, pair="gemma-270m", n_ctx=512, log=log.append)
    again = TraceSet(out).rows(0)
    assert np.allclose(again["target_features"], feats, atol=1e-4) and any("confidence" in line for line in log)
    assert all(np.array_equal(again[k], rows[k]) for k in rows if k != "target_features")
    assert len(TraceSet(out).episodes) == 1  # nothing traced twice


def test_a_local_verifier_loads_the_pairs_shipped_head_unless_told_not_to(gemma_paths, gemma_draft, tmp_path,
                                                                          monkeypatch):
    from edgekit.semantic import shipped

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)  # a head "shipped" for the gemma pair
    model = LlamaModel(str(gemma_paths[1]))
    head = link_only_head(tmp_path / "gemma-270m.onnx", draft_hidden=gemma_draft.n_embd, target_hidden=model.n_embd)
    small = ServerConfig(port=0, max_sessions=1, max_context=256, max_block=8)
    with EdgeClient(pair="gemma-270m", draft_model=gemma_draft, local_server=small) as client:
        assert client.server_info().semantic_head == head.identity
    off = ServerConfig(port=0, max_sessions=1, max_context=256, max_block=8, semantic_head="")
    with EdgeClient(pair="gemma-270m", draft_model=gemma_draft, local_server=off) as client:
        info = client.server_info()
        assert not info.semantic_head and "semantic" not in info.modes
