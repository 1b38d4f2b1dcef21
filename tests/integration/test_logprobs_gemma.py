"""The target's log-probabilities of the output tokens, returned when asked: from the verifier's
rounds (speculative decoding) and from target-only decoding, on the wire and in the SDK.

What these tests may expect, and why: the verifier computes them from the same target logits it
judges with, and with exact numerics (the default) its blocks reproduce single-row logits bit for
bit, so a greedy answer's log-probabilities equal target-only decoding's exactly; on the toy
engine the logits are known, so the values are checked against a log-softmax computed here."""

from __future__ import annotations

import pytest

from edgekit import EdgeClient, GenerationConfig


@pytest.mark.models
def test_greedy_logprobs_equal_target_only_decodings_on_the_real_pair(gemma_server, gemma_draft):
    with EdgeClient(gemma_server.address, draft=gemma_draft,
                    generation=GenerationConfig(max_tokens=24, logprobs=5, drafting="fixed", draft_k=4)) as client:
        spec = client.generate("The capital of France is").until_done()
        alone = client.generate_target_only("The capital of France is").until_done()
    assert spec.token_ids == alone.token_ids
    assert spec.logprobs == alone.logprobs  # bit for bit: exact numerics
    assert all(t.logprob <= 0 and len(t.top) == 5 for t in spec.logprobs)
