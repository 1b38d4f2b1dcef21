"""`edgekit api`'s Ollama API (/api/...), driven by the real `ollama` package (and httpx for
what it does not ask) over the gemma pair; the requests read without a server, on their own."""

from __future__ import annotations

import httpx
import pytest

from edgekit import ChatTemplate
from edgekit.api import _ollama
from edgekit.errors import ApiError

MODEL = "gemma-3-270m"


def test_a_verifier_gone_is_a_503_with_retry_after_in_ollamas_shape(api_verifier_gone):
    served, model = api_verifier_gone
    for stream in (False, True):
        r = httpx.post(f"{served.host}/api/generate", timeout=60,
                       json={"model": model, "prompt": "abc", "stream": stream, "options": {"num_predict": 4}})
        assert r.status_code == 503 and r.headers["retry-after"] and "unreachable" in r.json()["error"]


def _parse(body: dict, kind: str = "generate", template: ChatTemplate | None = None) -> _ollama.Request:
    return _ollama.parse(kind, {"model": MODEL, **body}, models=(MODEL, "gemma-270m"), max_tokens_limit=64,
                         template=template or ChatTemplate(None))


def test_options_become_generation_settings():
    greedy = _parse({"prompt": "x", "options": {"temperature": 0, "seed": -1, "num_predict": 8, "stop": "\n"}}).job
    assert greedy is not None and greedy.overrides == {"mode": "greedy", "max_tokens": 8, "seed": None}
    assert greedy.stop == ("\n",) and greedy.prompt == "x" and not greedy.chat
    default = _parse({"prompt": "x"})  # Ollama's defaults: streamed, sampled at 0.8, as long as allowed
    assert default.stream and default.job is not None
    assert default.job.overrides == {"mode": "sample", "temperature": 0.8, "max_tokens": 64, "seed": None}
    assert _parse({"prompt": "x", "options": {"num_predict": -2, "seed": 5}}).job.overrides["max_tokens"] == 64
    with pytest.raises(ApiError, match="num_predict"):
        _parse({"prompt": "x", "options": {"num_predict": 65}})


def test_sampler_options_take_edgekits_names_and_greedy_keeps_only_the_penalties():
    options = {"top_k": 40, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 32,
               "frequency_penalty": 0.2, "presence_penalty": 0.1}
    sampled = _parse({"prompt": "x", "options": {**options, "temperature": 0.7}}).job
    assert sampled is not None and sampled.overrides == {
        "mode": "sample", "temperature": 0.7, "max_tokens": 64, "seed": None, "top_k": 40, "top_p": 0.9,
        "min_p": 0.05, "repetition_penalty": 1.1, "penalty_last_n": 32, "frequency_penalty": 0.2,
        "presence_penalty": 0.1}
    greedy = _parse({"prompt": "x", "options": {**options, "temperature": 0}}).job
    assert greedy is not None and greedy.overrides == {  # the truncations keep the argmax: nothing to do
        "mode": "greedy", "max_tokens": 64, "seed": None, "repetition_penalty": 1.1, "penalty_last_n": 32,
        "frequency_penalty": 0.2, "presence_penalty": 0.1}
    with pytest.raises(ApiError, match="'top_k'"):
        _parse({"prompt": "x", "options": {"temperature": 0, "top_k": -2}})  # refused, greedy or not


def test_a_model_with_a_chat_template_gets_the_generate_prompt_as_the_users_turn():
    template = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    job = _parse({"prompt": "hi", "system": "be brief"}, template=template).job
    assert job is not None and job.chat
    assert job.prompt == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    raw = _parse({"prompt": "<user>hi", "raw": True}, template=template).job
    assert raw is not None and raw.prompt == "<user>hi" and not raw.chat
    chat = _parse({"messages": [{"role": "user", "content": "hi"}]}, kind="chat", template=template)
    assert chat.job is not None and chat.job.chat and chat.job.prompt == [{"role": "user", "content": "hi"}]
    assert _parse({"messages": []}, kind="chat").job is None  # load only
