"""Semantic mode on the real gemma pair: the engine's hidden rows leave the logits as they were,
the mode runs end to end through gRPC with a head of the pair's widths, and the task-outcome
labeller continues from the right prefix at every mismatch."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit import ClientConfig, EdgeClient, GenerationConfig, ServerConfig
from edgekit.runtime import LlamaContext, LlamaModel
from edgekit.semantic.head import link_only_head
from edgekit.transport import GrpcTransport
from edgekit.verifier import VerifierServer
from edgekit.verifier.engine import Feed, LlamaEngine

pytestmark = pytest.mark.models

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@pytest.mark.numerics
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
        # The rows are llama.cpp's final-layer, post-norm states of these positions: a context of its
        # own, set up as the engine's, decoding the block one row at a time, gets them bit for bit.
        # Exact numerics entitle that on any CPU: the engine's sub-batches reproduce single rows
        # (calibrated at start-up), and a row's logits are computed from its hidden state.
        ctx = LlamaContext(engine.model, n_ctx=256, embeddings=True, flash_attn=True)
        ctx.decode_sequence(head, 0, 0, last_output=False)
        ref_rows, ref_logits = [], []
        for i, tok in enumerate(block):
            ctx.decode([tok], [len(head) + i], [0], [True])
            ref_rows.append(ctx.hidden(0).copy())
            ref_logits.append(ctx.logits(0).copy())
        ctx.close()
        assert np.array_equal(np.stack(ref_logits), logits) and np.array_equal(np.stack(ref_rows), hidden)
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
    with EdgeClient(GrpcTransport(server.address, ClientConfig(timeout=60)), draft=draft,
                    generation=config) as client:
        return client.generate(PROMPT).until_done()


@pytest.mark.numerics
def test_semantic_mode_end_to_end_on_gemma(semantic_server, gemma_draft):
    # A threshold of 0 accepts no mismatch: greedy's tokens, although FH rounds decode with hidden
    # rows on, in calls of their own (exact numerics: the same logits either way, as tested above).
    greedy = _run(semantic_server, gemma_draft)
    strict = _run(semantic_server, gemma_draft, mode="semantic", upload="fh", semantic_threshold=0.0)
    assert strict.token_ids == greedy.token_ids and strict.stats.server.semantic_accepted == 0
    lenient = _run(semantic_server, gemma_draft, mode="semantic", upload="sh", semantic_threshold=1.0)
    assert lenient.stats.server.semantic_accepted > 0 and lenient.stats.accepted == lenient.stats.drafted
    assert lenient.stats.rounds < greedy.stats.rounds
    assert lenient.stats.semantic_head.startswith("gemma-link:")
    snap = semantic_server.service.stats.snapshot()
    assert snap.semantic_accepted >= lenient.stats.server.semantic_accepted


@pytest.mark.numerics
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
    # The reference: a fresh context, the prompt prefilled, then one row at a time, as greedy decoding
    # writes the answer and as the labeller rebuilds its prefix: the same calls on the same kernels,
    # so the same continuation on any CPU (a prefix decoded in one batch takes other kernels, and a
    # near-tie may then go the other way).
    for pos, tok in zip(rows["positions"], rows["draft_tokens"]):
        ctx = LlamaContext(model, n_ctx=512, n_batch=512)
        seq = [*prompt, *answer[:pos], int(tok)]
        ans = [*answer[:pos], int(tok)]
        ctx.decode_sequence(prompt[:-1], 0, 0, last_output=False)
        for i in range(len(prompt) - 1, len(seq)):
            ctx.decode([seq[i]], [i], [0], [True])
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


@pytest.mark.numerics
def test_traces_keep_the_targets_confidence_and_add_it_to_older_ones(gemma_paths, tmp_path):
    """Each mismatch's target features are the target's own distribution after the reference prefix,
    and an episode traced without them (before they were kept) gets them on the next collect."""
    from edgekit.semantic.collect import TraceSet, collect
    from edgekit.semantic.tasks import Task
    from edgekit.verifier import TARGET_FEATURES, target_features

    task = Task("toy/fib", PROMPT, lambda text: "return" in text, ("\ndef ",), 40)
    out = tmp_path / "traces"
    collect([task], gemma_paths[0], gemma_paths[1], out, pair="gemma-270m", n_ctx=512, log=lambda _: None)
    rows = TraceSet(out).rows(0)
    feats = rows["target_features"]
    assert feats.shape == (len(rows["positions"]), len(TARGET_FEATURES)) and len(feats) >= 2
    answer = TraceSet(out).episodes[0]["answer"]
    # The reference: the target's greedy decoding again, one row at a time after a prompt prefill,
    # in a context of its own. The same calls on the same kernels are deterministic, so the stored
    # features are these rows' bit for bit on any CPU; a batched pass would not be (other kernels:
    # up to 0.9 apart in these features on an AMD EPYC, by how much depends on the CPU).
    model = LlamaModel(gemma_paths[1])
    ctx = LlamaContext(model, n_ctx=512, n_batch=512)
    prompt = model.tokenize(PROMPT)
    ctx.decode_sequence(prompt[:-1], 0, 0, last_output=False)
    ctx.set_embeddings(True)
    feed = [prompt[-1], *answer]
    at = {int(p): i for i, p in enumerate(rows["positions"])}
    for offset in range(max(at) + 1):
        ctx.decode([feed[offset]], [len(prompt) - 1 + offset], [0], [True])
        logits = ctx.logits(0)
        assert int(np.argmax(logits)) == answer[offset]  # the row that chose the answer's token
        if offset in at:
            i = at[offset]
            want = target_features(logits[None, :], [int(rows["draft_tokens"][i])])[0]
            assert np.array_equal(feats[i], want), (offset, feats[i], want)
            assert feats[i][3] > 0 and feats[i][1] > feats[i][2]  # a mismatch: the target preferred its own token
    ctx.close()
    model.close()
    # an episode from before: its features are added on the next run, the rest of it unchanged
    npz = out / "episodes" / "0.npz"
    np.savez_compressed(npz, **{k: v for k, v in rows.items() if k != "target_features"})
    log: list[str] = []
    collect([task], gemma_paths[0], gemma_paths[1], out, pair="gemma-270m", n_ctx=512, log=log.append)
    again = TraceSet(out).rows(0)
    assert np.array_equal(again["target_features"], feats) and any("confidence" in line for line in log)
    assert all(np.array_equal(again[k], rows[k]) for k in rows if k != "target_features")
    assert len(TraceSet(out).episodes) == 1  # nothing traced twice


def test_a_local_verifier_loads_the_pairs_shipped_head_unless_told_not_to(gemma_paths, gemma_draft, tmp_path,
                                                                          monkeypatch):
    from edgekit import drafting

    monkeypatch.setattr(drafting, "shipped_dir", lambda package: tmp_path)  # a head "shipped" for the gemma pair
    model = LlamaModel(str(gemma_paths[1]))
    head = link_only_head(tmp_path / "gemma-270m.onnx", draft_hidden=gemma_draft.n_embd, target_hidden=model.n_embd)
    small = ServerConfig(port=0, max_sessions=1, max_context=256, max_block=8)
    with EdgeClient(pair="gemma-270m", draft=gemma_draft, local_server=small) as client:
        assert client.server_info().semantic_head == head.identity
    off = ServerConfig(port=0, max_sessions=1, max_context=256, max_block=8, semantic_head="")
    with EdgeClient(pair="gemma-270m", draft=gemma_draft, local_server=off) as client:
        info = client.server_info()
        assert not info.semantic_head and "semantic" not in info.modes


@pytest.mark.numerics
def test_rows_reduced_where_they_are_made_are_the_argmax_of_the_rows_copied_out(gemma_paths):
    """A greedy round's rows reduced in llama.cpp's output buffer (`Feed.argmax`) name the ids the
    copied rows' argmax names, over the ids asked for, in one batch with feeds that copy theirs;
    with fast numerics too, where every row of the batch goes in one decode."""
    for exact in (True, False):
        engine = LlamaEngine(str(gemma_paths[1]), max_context=256, n_seq=3, max_block=8, exact=exact)
        try:
            tokens = tuple(engine.model.tokenize(PROMPT))
            head, block = tokens[:-6], tokens[-6:]
            for seq in (0, 1, 2):
                engine.run_batch([Feed(seq, 0, head, 0)])
            n = len(block)
            full, best, fewer = engine.run_batch([
                Feed(0, len(head), block, n),
                Feed(1, len(head), block, n, argmax=engine.n_vocab),
                Feed(2, len(head), block, n, argmax=1000),
            ])
            assert best.dtype == np.int64 and best.tolist() == np.argmax(full, axis=1).tolist()
            assert fewer.tolist() == np.argmax(full[:, :1000], axis=1).tolist()
        finally:
            engine.close()
