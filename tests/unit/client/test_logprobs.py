"""The target's log-probabilities of the output tokens, returned when asked: from the verifier's
rounds (speculative decoding) and from target-only decoding, on the wire and in the SDK.

What these tests may expect, and why: the verifier computes them from the same target logits it
judges with, and with exact numerics (the default) its blocks reproduce single-row logits bit for
bit, so a greedy answer's log-probabilities equal target-only decoding's exactly; on the toy
engine the logits are known, so the values are checked against a log-softmax computed here."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit import ConfigError, GenerationConfig
from edgekit.protocol import TokenLogprobs, pb, token_logprobs
from edgekit.testing import ToyLanguageModel, toy_client


def test_token_logprobs_is_a_log_softmax_with_the_likeliest_first():
    logits = np.array([1.0, 3.0, 2.0, 3.0], dtype=np.float32)
    z = logits.astype(np.float64) - 3.0
    lp = z - np.log(np.exp(z).sum())
    t = token_logprobs(logits, 2, top=3)
    assert t.logprob == pytest.approx(lp[2], abs=1e-12)
    assert [i for i, _ in t.top] == [1, 3, 2]  # equal values: the lower id first
    assert [v for _, v in t.top] == pytest.approx([lp[1], lp[3], lp[2]], abs=1e-12)
    assert token_logprobs(logits, 0, top=0) == TokenLogprobs(pytest.approx(lp[0], abs=1e-12))


def test_each_output_token_comes_with_the_targets_logprobs():
    target = ToyLanguageModel(seed=4)
    client = toy_client(target, noise=1.5, max_tokens=24, draft_k=4, stop_at_eos=False)
    for mode in ("greedy", "sample"):
        final = client.generate("tell me", mode=mode, seed=2, logprobs=3).until_done()
        assert len(final.logprobs) == len(final.token_ids) == 24
        context = client.tokenize("tell me")
        for tok, lp in zip(final.token_ids, final.logprobs):
            z = target.logits(context).astype(np.float64)
            z = z - z.max() - np.log(np.exp(z - z.max()).sum())
            assert lp.logprob == pytest.approx(float(np.float32(z[tok])), abs=1e-6)
            assert len(lp.top) == 3 and lp.top[0][0] == int(np.argmax(z))
            context = [*context, tok]
        deltas = [ev for ev in client.generate("tell me", mode=mode, seed=2, logprobs=3) if ev.type == "text"]
        assert sum((d.logprobs for d in deltas), ()) == final.logprobs  # the same, delta by delta
    assert client.generate("tell me").until_done().logprobs == ()  # not asked: none computed, none sent


def test_target_only_decoding_returns_them_too_and_asks_are_checked():
    target = ToyLanguageModel(seed=4)
    client = toy_client(target, max_tokens=8, stop_at_eos=False)
    spec = client.generate("tell me", logprobs=2).until_done()
    alone = client.generate_target_only("tell me", logprobs=2).until_done()
    assert alone.token_ids == spec.token_ids and alone.logprobs == spec.logprobs
    with pytest.raises(ConfigError, match="logprobs"):
        GenerationConfig(logprobs=21)


def test_a_verifier_without_logprobs_is_refused_before_a_session_opens(monkeypatch):
    assert toy_client(ToyLanguageModel(seed=4)).server_info().max_top_logprobs == 20
    monkeypatch.setattr("edgekit.verifier._service.MAX_TOP_LOGPROBS", 0)  # private: a verifier from before logprobs
    client = toy_client(ToyLanguageModel(seed=4), max_tokens=4)
    with pytest.raises(ConfigError, match="does not return the target's log-probabilities"):
        client.generate("x", logprobs=0).until_done()


def test_the_wire_carries_them():
    from edgekit.protocol import VerifyResult, verify_response_from_pb, verify_response_to_pb

    v = VerifyResult(accepted=1, next_token=5, bonus=False, committed_length=9,
                     logprobs=(TokenLogprobs(-0.5, ((5, -0.5), (7, -1.25))), TokenLogprobs(-2.0)))
    back = verify_response_from_pb(pb.VerifyResponse.FromString(verify_response_to_pb(v).SerializeToString()))
    assert back.logprobs == v.logprobs
