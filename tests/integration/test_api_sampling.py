"""The OpenAI endpoint's sampling settings, from the official `openai` client, over the gemma pair:
each reaches the sampler under edgekit's names (the answer is `EdgeClient.generate`'s with the
same settings and seed), and what cannot be served is refused naming it.

What these tests may expect, and why: a sampled answer is a function of the seed, the prompt
and the settings on one machine (both sides draw from generators the seed fixes), so the
endpoint's answer and the SDK's are compared for equality; greedy answers with a penalty or a
bias are the target's own argmax after them (tests/integration/test_sampler_gemma.py checks that against
target-only decoding)."""

from __future__ import annotations

import openai
import pytest

pytestmark = [pytest.mark.models]

PROMPT = "List the colours of the rainbow:"


def _api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="sekret", max_retries=0, timeout=120)


def test_every_sampling_setting_reaches_the_sampler(gemma_api):
    served, client = gemma_api
    bias_token = client.tokenize(" red", special=False)[0]
    asked = dict(temperature=0.9, top_p=0.9, frequency_penalty=0.4, presence_penalty=0.3, seed=7,
                 logit_bias={str(bias_token): -5.0})
    extra = {"top_k": 30, "min_p": 0.02, "repetition_penalty": 1.2}  # vLLM's, in the body
    out = _api(served.url).completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=16, extra_body=extra,
                                              **asked)
    same = client.generate(PROMPT, mode="sample", max_tokens=16, temperature=0.9, top_p=0.9, frequency_penalty=0.4,
                           presence_penalty=0.3, seed=7, logit_bias={bias_token: -5.0}, top_k=30, min_p=0.02,
                           repetition_penalty=1.2).until_done()
    assert out.choices[0].text == same.text
    assert same.stats.sampler["top_k"] == 30 and same.stats.sampler["logit_bias"] == {bias_token: -5.0}


def test_greedy_takes_the_penalties_and_the_bias_and_top_k_1_is_greedy(gemma_api):
    served, client = gemma_api
    api = _api(served.url)
    plain = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=12, temperature=0)
    first = client.tokenize(plain.choices[0].text, special=False)[0]
    biased = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=12, temperature=0,
                                    logit_bias={str(first): -100})
    assert client.tokenize(biased.choices[0].text, special=False)[0] != first  # the bias moved the argmax
    ours = client.generate(PROMPT, mode="greedy", max_tokens=12, logit_bias={first: -100.0}).until_done()
    assert biased.choices[0].text == ours.text
    top1 = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=3,
                                  extra_body={"top_k": 1})
    assert top1.choices[0].text == plain.choices[0].text
    chat = api.chat.completions.create(model="gemma-3-270m", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=8, temperature=0.7, top_p=0.8, presence_penalty=0.5, seed=1)
    assert chat.choices[0].message.content is not None


@pytest.mark.parametrize(("setting", "value", "named"), [
    ("top_p", 0.0, "top_p"), ("frequency_penalty", 3.0, "frequency_penalty"),
    ("logit_bias", {"99999999": 1.0}, "logit_bias"), ("logit_bias", {"5": 500}, "logit_bias"),
    ("top_k", -5, "top_k"), ("repetition_penalty", 0.0, "repetition_penalty"), ("logprobs", 25, "logprobs"),
    ("top_logprobs", 2, "top_logprobs"),
])
def test_a_setting_out_of_range_is_a_400_naming_it(gemma_api, setting, value, named):
    served, _ = gemma_api
    with pytest.raises(openai.BadRequestError) as e:
        _api(served.url).completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=4,
                                            extra_body={setting: value})
    assert e.value.body["param"] == named and named in e.value.body["message"]


def test_logprobs_are_the_targets_and_come_only_when_asked(gemma_api):
    served, client = gemma_api
    api = _api(served.url)
    plain = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=10, temperature=0)
    assert plain.choices[0].logprobs is None
    out = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3)
    ours = client.generate(PROMPT, mode="greedy", max_tokens=10, logprobs=3).until_done()
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text == ours.text
    assert lp.token_logprobs == [t.logprob for t in ours.logprobs]
    assert [len(top) for top in lp.top_logprobs] == [3] * 10 and lp.text_offset[0] == 0
    streamed = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=10, temperature=0,
                                      logprobs=3, stream=True)
    values = [v for c in streamed if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert values == lp.token_logprobs
    chat = api.chat.completions.create(model="gemma-3-270m", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob for c in content)
