"""`edgekit api`: the device's OpenAI-compatible endpoint, driven by the real `openai` package
(and curl), over the gemma pair and over a toy verifier for the error paths."""

from __future__ import annotations

import threading

import openai
import pytest
from _served import Served

from edgekit import EdgeClient, ServerConfig
from edgekit.api import create_app
from edgekit.testing import FakeDraftModel, ToyLanguageModel
from edgekit.verifier import ToyEngine, VerifierServer


def _openai(url: str, key: str = "sekret") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def test_an_unreachable_verifier_is_a_503_with_retry_after(api_verifier_gone):
    served, model = api_verifier_gone
    with pytest.raises(openai.APIStatusError) as info:
        _openai(served.url, key="none").completions.create(model=model, prompt=[1, 2, 3], max_tokens=4)
    assert info.value.status_code == 503 and info.value.response.headers["retry-after"]


def test_requests_beyond_the_queue_are_answered_429():
    from edgekit.verifier import Coefficients, VerifyTimeEstimator

    lm = ToyLanguageModel(seed=4, eos_bias=-9.0)
    started, answered = threading.Event(), threading.Event()
    pass_ms = VerifyTimeEstimator(Coefficients(c=150.0)).predict  # 150 ms a target pass

    def cost(feeds):  # the first request's target passes wait until the second has been answered
        started.set()
        answered.wait(60)
        return pass_ms(feeds)

    slow = ToyEngine(lm, n_seq=4, max_context=512, cost=cost)
    # calibrate off: no step timed at start, whose passes would block here before any request
    server = VerifierServer(slow, ServerConfig(port=0, max_sessions=4, calibrate="off")).start()
    client = EdgeClient(server.address, draft=FakeDraftModel(ToyLanguageModel(seed=4, noise=0.5)))
    served = Served(create_app(client, concurrency=1, queue=0))
    try:
        api = _openai(served.url, key="none")
        statuses: list[int] = []

        def ask() -> None:
            try:
                api.completions.create(model=lm.name, prompt=[1, 2, 3], max_tokens=8, temperature=0)
                statuses.append(200)
            except openai.RateLimitError as e:
                statuses.append(e.status_code)

        first = threading.Thread(target=ask)
        first.start()
        assert started.wait(60)  # the first holds the only slot: its verifier is at work
        ask()
        answered.set()
        first.join(60)
        assert sorted(statuses) == [200, 429]
    finally:
        served.stop()
        client.close()
        server.stop()


def test_streamed_logprobs_never_run_ahead_of_the_text_a_stop_string_cuts():
    """Issue 52, item 3: a stream's log-probabilities came with every token received, while its text
    was held back (it might begin a stop string); the stop string then cut text whose tokens'
    log-probabilities had been sent. A chunk now carries those of the tokens its text completes."""
    from edgekit.api._openai import Chunks, Request
    from edgekit.client import GenerationStats
    from edgekit.protocol import TokenLogprobs

    pieces = {1: "Hel", 2: "lo", 3: " wor", 4: "ld"}
    req = Request("completion", "m", "p", 8, 0.0, None, ("lo w",), True, False, None, top_logprobs=0)
    chunks = Chunks(req, text_of=pieces.__getitem__)
    sent_text, sent_tokens = [], []

    def send(text, stats=None):
        for c in chunks(text, stats):
            choice = c["choices"][0]
            sent_text.append(choice.get("text") or "")
            if choice.get("logprobs"):
                sent_tokens.extend(choice["logprobs"]["tokens"])

    # what `pieces` sends as "Hello world" comes with the stop string "lo w": "l" of "Hello" held
    # back until the stop string shows, then the text before it, then the end
    req.tokens.append((1, TokenLogprobs(-0.1)))
    send("He")
    req.tokens.append((2, TokenLogprobs(-0.2)))
    send("l")
    req.tokens.append((3, TokenLogprobs(-0.3)))
    send("")  # the text before the stop string: nothing more
    del req.tokens[1:]  # the tokens of the text returned ("Hel")
    send("", GenerationStats(mode="greedy", draft_k=0, finish_reason="stop"))
    assert "".join(sent_text) == "Hel" and "".join(sent_tokens) == "Hel", (sent_text, sent_tokens)

    # without a stop string, the last chunk carries every token left
    req2 = Request("completion", "m", "p", 8, 0.0, None, (), True, False, None, top_logprobs=0)
    chunks = Chunks(req2, text_of=pieces.__getitem__)
    sent_text, sent_tokens = [], []
    req2.tokens.extend([(1, TokenLogprobs(-0.1)), (2, TokenLogprobs(-0.2))])
    send("Hel")
    req2.tokens.extend([(3, TokenLogprobs(-0.3)), (4, TokenLogprobs(-0.4))])
    send("lo world", GenerationStats(mode="greedy", draft_k=0, finish_reason="length"))
    assert "".join(sent_tokens) == "".join(sent_text) == "Hello world"
