"""Lossless speculative sampling against a stock OpenAI-compatible server (vLLM's API, served
locally over a toy target by tests/http_fakes.py): a top-k within the server's logprob cap needs
only the top-k log-probabilities it returns at each position, and the device applies the sampler
and the acceptance rule to them.

What these tests may expect, and why: the toy target's logits are known exactly, so the first
two committed tokens of many seeded runs are compared with the exact joint distribution of the
target's own sampler (top-k, then temperature, min-p and top-p over what it keeps) by a
chi-square test at significance 0.001; seeds are fixed, so a pass is reproducible. The draft is
a noisy copy of the target at another temperature, so blocks are both accepted and rejected."""

from __future__ import annotations

import numpy as np
import pytest
from _exact import pair_pvalue
from http_fakes import FakeOpenAIServer, FakeSGLangServer

from edgekit import ClientConfig, ConfigError, EdgeClient, GenerationConfig, Sampler
from edgekit.testing import FakeDraftModel, ToyLanguageModel

TARGET = ToyLanguageModel(seed=11)
ALPHA = 1e-3
RUNS = 600  # 70 s each at 800 on 2 cores: CI's time


def _draft() -> FakeDraftModel:
    return FakeDraftModel(ToyLanguageModel(seed=11, noise=1.5))


@pytest.fixture(scope="module")
def vllm():
    draft = _draft()
    with FakeOpenAIServer(TARGET, lambda t: draft.token_bytes(t).decode(),
                          tokenize=lambda text: draft.tokenize(text), scale_out=True) as server:
        yield server


def _client(url: str, **gen) -> EdgeClient:
    config = GenerationConfig(**({"mode": "sample", "max_tokens": 2, "stop_at_eos": False, "drafting": "fixed",
                                  "draft_k": 2, "draft_temperature": 1.5} | gen))
    return EdgeClient(url, draft=_draft(), generation=config, config=ClientConfig(timeout=30))


@pytest.mark.parametrize(("settings", "route"), [
    (dict(top_k=6), "prompt-logprobs"),
    (dict(top_k=12, temperature=0.7, top_p=0.8, min_p=0.05), "prompt-logprobs"),
    # one-token completions of each prefix: the top-k of the position each generates
    (dict(top_k=12, temperature=0.7, top_p=0.8, min_p=0.05), "prefixes"),
    # vLLM's token-in/token-out route: the top-k at every position, and after the block, in one request
    (dict(top_k=12, temperature=0.7, top_p=0.8, min_p=0.05), "generate"),
])
def test_top_k_sampling_through_a_stock_server_is_the_targets_own(vllm, settings, route):
    sampler = GenerationConfig(mode="sample", **settings).sampler()
    _is_the_targets_own_sampling(f"openai+{vllm.url}?route={route}", settings)
    if route == "generate":
        assert all(r["sampling_params"]["prompt_logprobs"] == r["sampling_params"]["logprobs"] == sampler.top_k
                   for r in vllm.requests[-3:])
        return
    assert all(r.get("logprobs") == sampler.top_k for r in vllm.requests[-3:])  # asked for the top-k only
    assert all(r.get("echo") is (route == "prompt-logprobs") for r in vllm.requests[-3:])


def test_top_k_sampling_through_sglang_is_the_targets_own():
    """SGLang's /generate: one request a round, the top-k at every block position and after it
    (`top_logprobs_num`), asked from the position before the block (tests/http_fakes.py follows
    SGLang's documented shapes: SGLang does not run on these machines)."""
    draft = _draft()
    settings = dict(top_k=12, temperature=0.7, top_p=0.8, min_p=0.05)
    with FakeSGLangServer(TARGET, lambda t: draft.token_bytes(t).decode()) as sglang:
        _is_the_targets_own_sampling(f"sglang+{sglang.url}", settings)
        rounds = [r for r in sglang.requests if r.get("top_logprobs_num") == 12]
        assert rounds and all(r["sampling_params"]["max_new_tokens"] == 1 for r in rounds)


def _is_the_targets_own_sampling(url: str, settings: dict) -> None:
    """RUNS seeded answers through `url`: their first two tokens distributed as the target's own sampler's."""
    sampler = GenerationConfig(mode="sample", **settings).sampler()
    with _client(url, **settings) as client:
        prompt = client.tokenize("speculate")
        drafted = accepted = 0
        counts: dict[tuple[int, int], int] = {}
        for seed in range(RUNS):
            final = client.generate(prompt, seed=seed).until_done()
            drafted, accepted = drafted + final.stats.drafted, accepted + final.stats.accepted
            pair = tuple(final.token_ids[:2])
            counts[pair] = counts.get(pair, 0) + 1
    assert 0.05 < accepted / drafted < 0.95, "the test must see acceptances and rejections"
    p1 = sampler.probs(TARGET.logits(prompt).astype(np.float32))
    exact = {(a, b): p1[a] * q for a in np.flatnonzero(p1)
             for b, q in enumerate(sampler.probs(TARGET.logits([*prompt, int(a)]).astype(np.float32))) if q > 0}
    assert set(counts) <= set(exact), "a pair the target's sampler never draws was committed"
    assert pair_pvalue(counts, exact) > ALPHA


def test_what_a_stock_server_cannot_sample_is_refused_saying_why(vllm):
    for settings, says in ((dict(), "needs a top_k from 1 to 20"), (dict(top_k=21), "needs a top_k from 1 to 20"),
                           (dict(top_k=5, repetition_penalty=1.1), "does not apply penalties"),
                           (dict(top_k=5, logit_bias={3: 1.0}), "does not apply logit_bias")):
        with _client(f"openai+{vllm.url}", **settings) as client, pytest.raises(ConfigError, match=says):
            client.generate("speculate").until_done()
    with _client(f"openai+{vllm.url}?max_logprobs=32", top_k=21) as client:  # a server started with a higher cap
        assert len(client.generate("speculate").until_done().token_ids) == 2
    with pytest.raises(ConfigError, match="max_logprobs"):
        _client(f"openai+{vllm.url}?max_logprobs=x", top_k=5).generate("speculate").until_done()
    assert Sampler(top_k=5).features() == ("top_k",)
