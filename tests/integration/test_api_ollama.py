"""`edgekit api`'s Ollama API (/api/...), driven by the real `ollama` package (and httpx for
what it does not ask) over the gemma pair; the requests read without a server, on their own."""

from __future__ import annotations

import httpx
import ollama
import pytest

MODEL = "gemma-3-270m"
PROMPT = "def fibonacci(n):"
GREEDY = {"temperature": 0}


def _client(served, key: str = "sekret") -> ollama.Client:
    return ollama.Client(host=served.host, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _refusal(call) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as info:
        call()
    return info.value


def test_generate_greedy_is_edgekit_generate_whole_and_streamed(gemma_api):
    served, client = gemma_api
    api = _client(served)
    expected = client.generate(PROMPT, max_tokens=16, mode="greedy").until_done()
    out = api.generate(model=MODEL, prompt=PROMPT, options={**GREEDY, "num_predict": 16})
    assert out.response == expected.text and out.done and out.done_reason == "length" and out.model == MODEL
    assert out.eval_count == 16 and out.prompt_eval_count == len(client.tokenize(PROMPT))
    assert out.total_duration >= out.eval_duration > 0 and out.prompt_eval_duration > 0 and out.load_duration == 0
    parts = list(api.generate(model=f"{MODEL}:latest", prompt=PROMPT, options={**GREEDY, "num_predict": 16},
                              stream=True))
    assert "".join(p.response for p in parts) == expected.text
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 16 and parts[-1].model == f"{MODEL}:latest"


def test_chat_greedy_is_edgekit_chat_whole_and_streamed(gemma_api):
    served, client = gemma_api
    api = _client(served)
    messages = [{"role": "user", "content": "Name a color."}]
    expected = client.chat(messages, max_tokens=12, mode="greedy").text()
    out = api.chat(model=MODEL, messages=messages, options={**GREEDY, "num_predict": 12})
    assert out.message.role == "assistant" and out.message.content == expected and expected
    parts = list(api.chat(model=MODEL, messages=messages, options={**GREEDY, "num_predict": 12}, stream=True))
    assert "".join(p.message.content for p in parts) == expected
    assert all(p.message.role == "assistant" for p in parts) and parts[-1].done and parts[-1].eval_count == 12


def test_without_a_chat_template_generate_sends_the_prompt_as_it_is_and_the_system_text_before_it(gemma_api):
    served, client = gemma_api
    assert client.chat_template().is_plain  # gemma-3-270m is a base model: Ollama's default template
    api = _client(served)
    options = {**GREEDY, "num_predict": 6}
    raw = api.generate(model=MODEL, prompt=PROMPT, raw=True, options=options).response
    assert raw == client.generate(PROMPT, max_tokens=6, mode="greedy").text()
    system = "You write short Python."
    with_system = api.generate(model=MODEL, prompt=PROMPT, system=system, options=options).response
    assert with_system == client.generate(f"{system}\n\n{PROMPT}", max_tokens=6, mode="greedy").text()


def test_a_seed_repeats_a_sampled_answer(gemma_api):
    served, _ = gemma_api
    api = _client(served)
    options = {"temperature": 0.9, "seed": 11, "num_predict": 10}
    first = api.generate(model=MODEL, prompt="Once upon a time", options=options)
    again = api.generate(model=MODEL, prompt="Once upon a time", options=options)
    assert first.response == again.response and first.eval_count == again.eval_count <= 10


def test_a_stop_string_ends_the_answer_before_it_whole_and_streamed(gemma_api):
    served, _ = gemma_api
    api = _client(served)
    full = api.generate(model=MODEL, prompt=PROMPT, options={**GREEDY, "num_predict": 24}).response
    stop = full.strip()[3:6]  # a piece from inside the greedy answer
    options = {**GREEDY, "num_predict": 24, "stop": [stop, "never said"]}
    cut = api.generate(model=MODEL, prompt=PROMPT, options=options)
    assert cut.response == full[: full.index(stop)] and cut.done_reason == "stop" and 0 < cut.eval_count < 24
    parts = list(api.generate(model=MODEL, prompt=PROMPT, options=options, stream=True))
    assert "".join(p.response for p in parts) == cut.response and parts[-1].done_reason == "stop"


def test_top_k_1_samples_the_greedy_answer(gemma_api):
    served, _ = gemma_api
    api = _client(served)
    greedy = api.generate(model=MODEL, prompt=PROMPT, options={**GREEDY, "num_predict": 12}).response
    top1 = api.generate(model=MODEL, prompt=PROMPT, options={"temperature": 1.5, "top_k": 1, "num_predict": 12})
    assert top1.response == greedy


def test_penalties_reach_the_sampler_under_edgekits_names(gemma_api):
    served, client = gemma_api
    api = _client(served)
    prompt = "1, 1, 1, 1, 1, 1, 1, 1,"
    plain = api.generate(model=MODEL, prompt=prompt, options={**GREEDY, "num_predict": 8}).response
    options = {"repeat_penalty": 1.8, "repeat_last_n": -1, "frequency_penalty": 0.5, "presence_penalty": 0.5}
    penalized = api.generate(model=MODEL, prompt=prompt, options={**GREEDY, "num_predict": 8, **options}).response
    expected = client.generate(prompt, max_tokens=8, mode="greedy", repetition_penalty=1.8, penalty_last_n=-1,
                               frequency_penalty=0.5, presence_penalty=0.5).text()
    assert penalized == expected != plain  # greedy decoding takes its argmax after the penalties


def test_runtime_options_are_ignored_and_change_nothing(gemma_api):
    served, _ = gemma_api
    api = _client(served)
    plain = api.generate(model=MODEL, prompt=PROMPT, options={**GREEDY, "num_predict": 6}).response
    tuned = api.generate(model=MODEL, prompt=PROMPT, keep_alive="5m", options={
        **GREEDY, "num_predict": 6, "num_ctx": 8192, "num_thread": 2, "num_gpu": 0, "use_mmap": True,
        "mirostat": 0, "mirostat_tau": 5.0, "typical_p": 1.0, "tfs_z": 1.0}).response
    assert tuned == plain


def test_the_models_are_listed_shown_and_loaded(gemma_api):
    served, client = gemma_api
    api = _client(served)
    assert [m.model for m in api.list().models] == [MODEL, "gemma-270m"]
    shown = api.show(f"{MODEL}:latest")
    assert shown.modelinfo["edgekit.context_length"] == client.server_info().max_context
    assert shown.modelinfo["edgekit.draft_model"] == client.draft.name and shown.capabilities == ["completion"]
    assert [m.model for m in api.ps().models] == [MODEL, "gemma-270m"]
    version = httpx.get(f"{served.host}/api/version", headers={"Authorization": "Bearer sekret"})
    assert version.status_code == 200 and version.json()["version"]
    loaded = api.generate(model=MODEL)  # no prompt: Ollama's way to load a model
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_ollama_streams_json_lines_unless_told_not_to(gemma_api):
    served, _ = gemma_api
    body = {"model": MODEL, "prompt": PROMPT, "options": {**GREEDY, "num_predict": 4}}
    with httpx.stream("POST", f"{served.host}/api/generate", json=body, headers={"Authorization": "Bearer sekret"},
                      timeout=120) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [httpx.Response(200, content=line).json() for line in r.iter_lines() if line]
    assert len(lines) >= 2 and lines[-1]["done"] and not lines[0]["done"]
    whole = httpx.post(f"{served.host}/api/generate", json={**body, "stream": False},
                       headers={"Authorization": "Bearer sekret"}, timeout=120).json()
    assert whole["response"] == "".join(line["response"] for line in lines)


def test_errors_are_ollama_shaped_and_name_what_is_refused(gemma_api):
    served, _ = gemma_api
    api = _client(served)
    missing = _refusal(lambda: api.generate(model="llama3.2", prompt="hi"))
    assert missing.status_code == 404 and "llama3.2" in missing.error and MODEL in missing.error
    for options, named in (({"mirostat": 2}, "mirostat"), ({"typical_p": 0.5}, "typical_p"),
                           ({"num_predict": 0}, "num_predict"), ({"temperature": -1}, "temperature"),
                           ({"seed": "x"}, "seed"), ({"stop": [""]}, "stop"), ({"rope_scale": 2}, "rope_scale"),
                           ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_p": 1}, "min_p"),
                           ({"repeat_penalty": 0}, "repeat_penalty"), ({"repeat_last_n": -3}, "repeat_last_n")):
        refused = _refusal(lambda options=options: api.generate(model=MODEL, prompt="hi", options=options))
        assert refused.status_code == 400 and named in refused.error, (options, refused.error)
    for call, named in ((lambda: api.generate(model=MODEL, prompt="hi", format="json"), "format"),
                        (lambda: api.generate(model=MODEL, prompt="hi", think=True), "think"),
                        (lambda: api.generate(model=MODEL, prompt="hi", raw=True, system="x"), "system"),
                        (lambda: api.chat(model=MODEL, messages=[{"role": "user", "content": "hi",
                                                                  "images": [b"\x89PNG"]}]), "images"),
                        (lambda: api.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          tools=[{"type": "function", "function": {"name": "f"}}]), "tools")):
        refused = _refusal(call)
        assert refused.status_code == 400 and named in refused.error, refused.error
    assert _refusal(lambda: _client(served, key="wrong").list()).status_code == 401
    raw = httpx.post(f"{served.host}/api/chat", json={"model": "nope", "messages": []},
                     headers={"Authorization": "Bearer sekret"})
    assert raw.status_code == 404 and list(raw.json()) == ["error"]
