"""Speculative sampling with every sampler setting, on the real gemma pair through the real gRPC
verifier, against the target's own sampler with the same settings.

What these tests may expect, and why: the committed tokens must be distributed exactly as the
target's sampler (`Sampler.probs` of the target's logits after the prompt and the tokens before).
Each setting alone and all of them combined get 150 seeded generations of three tokens with a
window of two, so the first round commits one to three of them (accepted, resampled, bonus) and
a second round the rest: positions 1, 2 and 3, each tested under its exact conditional
distribution, decoded here one token at a time (`_exact.ExactTarget`). Two tests at 0.001 each:
Kolmogorov-Smirnov on the randomised PIT of all 450 tokens (uniform iff the output is distributed
as the sampler, Rosenblatt), and chi-square of the first token over the tokens expected at least
5 times. The exact distributions are decoded as target-only decoding does (single rows after the
prompt's batch), which the verifier's exact numerics reproduce bit for bit, so a token the exact
sampler never draws must never be committed (counted; decoded in one batch instead, the logits
moved a top-p boundary and two such tokens were committed in 600). The prompt repeats its likely
continuation, so the penalties change the distributions a lot (checked: the total variation to
the plain softmax at the first position is asserted large enough to matter).

The draft samples at temperature 1.6 without the truncations' help on its side being needed
(the device applies the same settings to the draft's logits; only acceptance changes)."""

from __future__ import annotations

import numpy as np
import pytest
from _exact import ExactTarget, pit
from scipy.stats import chisquare, kstest

from edgekit import EdgeClient, GenerationConfig, Sampler

pytestmark = [pytest.mark.models]

PROMPT = "Repeat after me: apple apple apple apple apple apple"
RUNS = 150
ALPHA = 1e-3

SETTINGS = {
    "top_k": dict(top_k=8),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.1),
    "repetition_penalty": dict(repetition_penalty=1.5),
    "frequency_penalty": dict(frequency_penalty=0.8),
    "presence_penalty": dict(presence_penalty=1.2),
    "logit_bias": dict(logit_bias="apple"),  # filled in with the id of " apple": pushed down
    "combined": dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                     frequency_penalty=0.2, presence_penalty=0.2, penalty_last_n=32, logit_bias="apple"),
}


@pytest.fixture(scope="module")
def client(gemma_server, gemma_draft):
    c = EdgeClient(gemma_server.address, draft=gemma_draft,
                   generation=GenerationConfig(mode="sample", drafting="fixed", draft_k=2, max_tokens=3,
                                               draft_temperature=1.6, stop_at_eos=False))
    yield c
    c.close()


def _settings(name: str, client: EdgeClient) -> dict:
    settings = dict(SETTINGS[name])
    if settings.get("logit_bias") == "apple":
        apple = client.tokenize(" apple", special=False)
        assert len(apple) == 1
        settings["logit_bias"] = {apple[0]: -3.0}
    return settings


# CI's time: each feature alone is slow (a minute each on 2 cores); "combined" holds them all, at once.
ALONE_SLOW = ("top_p", "min_p", "frequency_penalty", "presence_penalty", "logit_bias")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ALONE_SLOW else n for n in SETTINGS])
def test_committed_tokens_follow_the_targets_own_sampler(name, client, gemma_paths):
    settings = _settings(name, client)
    sampler = GenerationConfig(mode="sample", temperature=settings.pop("temperature", 1.0), **settings).sampler()
    prompt = client.tokenize(PROMPT)
    exact = ExactTarget(gemma_paths[1], prompt, sampler)
    plain = ExactTarget(gemma_paths[1], prompt, Sampler(temperature=sampler.temperature))
    rng = np.random.default_rng(2024)
    us, firsts, outside = [], [], 0
    drafted = accepted = 0
    try:
        for seed in range(RUNS):
            final = client.generate(prompt, temperature=sampler.temperature, seed=seed, **settings).until_done()
            drafted += final.stats.drafted
            accepted += final.stats.accepted
            tokens = list(final.token_ids)
            assert len(tokens) == 3
            firsts.append(tokens[0])
            for i, x in enumerate(tokens):
                p = exact.probs(tokens[:i])
                outside += p[x] == 0
                us.append(pit(p, x, rng.random()))
        p1 = exact.probs()
        moved = 0.5 * float(np.abs(p1 - plain.probs()).sum())
    finally:
        exact.close()
        plain.close()
    assert moved > 0.05, f"the setting changes the first distribution by only {moved:.3f}: the test sees nothing"
    assert outside == 0, f"{outside} tokens the target's sampler never draws were committed"
    assert 0.1 < accepted / drafted < 0.95, f"acceptance {accepted / drafted:.2f}: the test must see both outcomes"
    ks = kstest(us, "uniform")
    assert ks.pvalue > ALPHA, (name, ks)
    bins = np.flatnonzero(RUNS * p1 >= 5)
    observed = [firsts.count(int(b)) for b in bins]
    expected = [RUNS * p1[b] for b in bins]
    if RUNS - sum(expected) > 1e-6:  # the tokens expected fewer than 5 times, pooled
        observed.append(RUNS - sum(observed))
        expected.append(RUNS - sum(expected))
    chi = chisquare(observed, np.asarray(expected) * sum(observed) / sum(expected)) if len(observed) > 1 else None
    assert chi is None or chi.pvalue > ALPHA, (name, chi, list(zip(bins.tolist(), observed, expected)))
    chi_p = f"{chi.pvalue:.3f}" if chi is not None else "- (one token)"
    print(f"{name}: KS p={ks.pvalue:.3f}, chi-square p={chi_p}, acceptance {accepted / drafted:.2f}, moved {moved:.2f}")


def test_greedy_with_penalties_and_bias_is_the_targets_own(client):
    """Greedy takes the argmax after the penalties and the bias, on both paths: token-identical."""
    settings = dict(repetition_penalty=1.3, presence_penalty=0.5, penalty_last_n=16,
                    logit_bias=_settings("logit_bias", client)["logit_bias"])
    for prompt in (PROMPT, "def fibonacci(n):", "The three laws of thermodynamics are"):
        spec = client.generate(prompt, mode="greedy", max_tokens=24, **settings).until_done()
        alone = client.generate_target_only(prompt, mode="greedy", max_tokens=24, **settings).until_done()
        plain = client.generate_target_only(prompt, mode="greedy", max_tokens=24).until_done()
        assert list(spec.token_ids) == list(alone.token_ids)
        if prompt == PROMPT:
            assert list(alone.token_ids) != list(plain.token_ids)  # the settings changed the answer
