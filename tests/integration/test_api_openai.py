"""`edgekit api`: the device's OpenAI-compatible endpoint, driven by the real `openai` package
(and curl), over the gemma pair and over a toy verifier for the error paths."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import openai
import pytest
from _served import Served

from edgekit import ClientConfig, EdgeClient
from edgekit.api import create_app


def _openai(url: str, key: str = "sekret") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


PROMPT = "def fibonacci(n):"


@pytest.mark.parametrize("route", ["speculative", "target-only"])
def test_an_unchanged_openai_client_lists_the_model_and_completes_greedily_as_edgekit_generate(gemma_server, route):
    """Either way an "auto" answer goes, the text is the target's; the usage says what was drafted
    (the route is pinned: which one "auto" takes first depends on the machine's draft and target steps)."""
    with EdgeClient(gemma_server.address, config=ClientConfig(first_route=route)) as client:
        served = Served(create_app(client, api_key="sekret"))
        try:
            api = _openai(served.url)
            assert [m.id for m in api.models.list().data] == ["gemma-3-270m", "gemma-270m"]
            out = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=24, temperature=0)
        finally:
            served.stop()
        expected = client.generate_target_only(PROMPT, max_tokens=24, mode="greedy").until_done()
        assert out.choices[0].text == expected.text and out.choices[0].finish_reason == "length"
        u = out.usage.model_dump()
        assert u["completion_tokens"] == 24 and u["prompt_tokens"] == len(client.tokenize(PROMPT))
    if route == "speculative":
        assert u["num_draft_tokens"] >= u["num_accepted_draft_tokens"] > 0 and 0 < u["draft_acceptance_rate"] <= 1
        assert u["mean_acceptance_length"] >= 1 and sum(u["acceptance_histogram"]) == u["rounds"] > 0
    else:  # the verifier's target-only stream: nothing drafted, a target pass (a "round") per token
        assert u["num_draft_tokens"] == u["num_accepted_draft_tokens"] == 0 and u["rounds"] == 24
        assert u["acceptance_histogram"] == [] and u["mean_acceptance_length"] == 1.0


def test_chat_streams_deltas_and_ends_with_the_usage(gemma_api):
    served, _client = gemma_api
    api = _openai(served.url)
    messages = [{"role": "user", "content": "Name a color."}]
    chunks = list(api.chat.completions.create(model="gemma-3-270m", messages=messages, max_tokens=12,
                                              temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = api.chat.completions.create(model="gemma-3-270m", messages=messages, max_tokens=12, temperature=0)
    assert text == whole.choices[0].message.content and text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_stop_string_ends_the_answer_before_it(gemma_api):
    served, _client = gemma_api
    full = _openai(served.url).completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=24, temperature=0)
    stop = full.choices[0].text.strip()[3:6]  # a piece from inside the greedy answer
    cut = _openai(served.url).completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=24, temperature=0,
                                                 stop=[stop])
    assert cut.choices[0].text == full.choices[0].text[: full.choices[0].text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_errors_are_openai_shaped_with_the_right_status(gemma_api):
    served, _ = gemma_api
    api = _openai(served.url)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.completions.create(model="gpt-4", prompt="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        api.completions.create(model="gemma-3-270m", prompt="hi", max_tokens=4, top_p=1.5)
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        api.chat.completions.create(model="gemma-3-270m", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.AuthenticationError):
        _openai(served.url, key="wrong").models.list()


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_gets_server_sent_events(gemma_api):
    served, _ = gemma_api
    body = json.dumps({"model": "gemma-3-270m", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True})
    done = subprocess.run(["curl", "-sS", "-N", f"{served.url}/completions", "-H", "Authorization: Bearer sekret",
                           "-H", "Content-Type: application/json", "-d", body], capture_output=True, text=True,
                          timeout=120)
    events = [line[6:] for line in done.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 3
    assert all(json.loads(e)["object"] == "text_completion" for e in events[:-1])


def test_concurrent_requests_each_get_their_own_answer(gemma_api):
    served, client = gemma_api
    prompts = ["def add(a, b):", "The capital of France is", "import numpy as np\n", "Once upon a time"]
    expected = [client.generate_target_only(p, max_tokens=12, mode="greedy").until_done().text for p in prompts]
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        results[i] = _openai(served.url).completions.create(
            model="gemma-3-270m", prompt=prompts[i], max_tokens=12, temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]  # 2 at a time, 2 queued
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [results[i] for i in range(len(prompts))] == expected


def test_a_stop_string_in_a_stream_cuts_it_as_without(gemma_api):
    served, _ = gemma_api
    api = _openai(served.url)
    full = api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    stop = full.strip()[4:7]
    chunks = list(api.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=24, temperature=0,
                                         stop=stop, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full[: full.index(stop)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert 0 < chunks[-1].usage.completion_tokens < 24


def test_nulls_negative_seeds_and_content_parts_are_taken_as_openai_means_them(gemma_api):
    served, _ = gemma_api
    out = _openai(served.url).chat.completions.create(
        model="gemma-3-270m", max_tokens=4, temperature=0.7, seed=-5, n=None, top_p=None,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}],
    )
    assert out.choices[0].message.role == "assistant" and out.usage.completion_tokens <= 4


def test_a_client_that_leaves_mid_stream_gives_its_draft_slot_back(gemma_api):
    import http.client

    served, client = gemma_api
    free = client._parts.pool.free_slots()
    body = {"model": "gemma-3-270m", "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": "Bearer sekret", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    conn.close()  # one event, then the client is gone
    deadline = time.monotonic() + 30
    while client._parts.pool.free_slots() != free:
        assert time.monotonic() < deadline, "the left stream still holds its draft slot"
        time.sleep(0.1)
