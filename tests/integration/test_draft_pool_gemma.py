"""The draft pool (issue 18, item 1): one draft model, a KV sequence per task, the steps of
tasks drafting at the same time run as one decode. Over a toy backend: slots are
independent, concurrent steps are batched and each task gets what it would alone, long
prefills are chunked, a failing step fails alone, slots are given back. Over the gemma
draft: a slot drafts what the plain draft model drafts."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgekit.runtime import DraftPool


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64) - z.max()
    return z - np.log(np.exp(z).sum())


@pytest.mark.numerics
def test_a_slot_of_the_gemma_draft_drafts_what_the_plain_draft_model_drafts(gemma_paths):
    """Three slots, each teacher-forced along what the plain draft model drafts greedily alone, at
    the same time: each step's distribution is the plain one's, up to kernels. What it may expect:
    a decode of several rows takes other llama.cpp kernels than one row, so the numbers may differ
    in their last bits by CPU (bit for bit here, on the native AVX-512 and an AVX2-only build); on
    gemma, a batch against single rows moved the top-5 log-probabilities by at most 0.87 nats (40-row
    batches, both builds). A slot that read another sequence's KV, or the wrong positions, would
    give another distribution altogether."""
    from edgekit.runtime import LlamaDraftModel, LlamaPoolBackend

    gemma_draft_path = gemma_paths[0]
    prompts = ["def fibonacci(n):", "The capital of France is", "1, 2, 3, 4,"]
    plain = LlamaDraftModel(gemma_draft_path, n_ctx=512)
    alone: list[list[int]] = []
    expected: list[list[np.ndarray]] = []
    for text in prompts:
        plain.truncate(0)
        tokens, rows, feed = [], [], plain.tokenize(text)
        for _ in range(12):
            z = plain.eval(feed).logits
            rows.append(_log_softmax(z))
            tokens.append(int(np.argmax(z)))
            feed = [tokens[-1]]
        alone.append(tokens)
        expected.append(rows)
    plain.close()

    def forced(slot, prompt: list[int], path: list[int], into: list) -> None:
        feed = prompt
        for tok in path:
            into.append(_log_softmax(slot.eval(feed).logits))
            feed = [tok]

    pool = DraftPool(LlamaPoolBackend(gemma_draft_path, slots=3, n_ctx_seq=512))
    try:
        slots = [pool.acquire() for _ in prompts]
        results: list[list[np.ndarray]] = [[] for _ in prompts]
        threads = [threading.Thread(target=forced, args=(s, s.tokenize(p), a, r))
                   for s, p, a, r in zip(slots, prompts, alone, results)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert pool.decodes < pool.steps  # some steps ran together
        for want, got in zip(expected, results, strict=True):
            assert len(got) == len(want) == 12
            for step, (w, g) in enumerate(zip(want, got)):
                top = np.argsort(w)[-5:]
                assert np.abs(w[top] - g[top]).max() <= 1.0, (step, w[top], g[top])
        out = slots[0].eval([alone[0][-1]], hidden=True)
        assert out.hidden is not None and out.hidden.shape == (slots[0].n_embd,)
    finally:
        pool.close()
