"""The qwen-coder pair (1.6 GB; `make test-all` pulls it): exactness and chat on a real instruct model."""

from __future__ import annotations

import pytest

from edgekit import EdgeClient, GenerationConfig, ServerConfig

pytestmark = pytest.mark.slow

PROMPTS = ["def quicksort(arr):", "The difference between a list and a tuple in Python is",
           "SELECT * FROM orders WHERE"]


@pytest.fixture(scope="module")
def qwen():
    from edgekit.models import pair_paths

    pair_paths("qwen-coder")  # fails with the pull command if missing
    client = EdgeClient(
        pair="qwen-coder",
        generation=GenerationConfig(max_tokens=24, drafting="fixed"),
        local_server=ServerConfig(port=0, max_sessions=2, max_context=2048),
    )
    yield client
    client.close()


def test_greedy_is_token_identical_to_target_only(qwen):
    for prompt in PROMPTS:
        base = qwen.generate_target_only(prompt).until_done().token_ids
        for k in (2, 6):
            assert qwen.generate(prompt, draft_k=k).until_done().token_ids == base, (prompt, k)


def test_an_extended_chat_holds_what_rendering_it_from_scratch_gives(qwen):
    """Turn 2 appends tokens to the session; the result must be exactly the
    tokenization of the whole conversation rendered by the GGUF template."""
    template = qwen.chat_template()
    assert "<|im_start|>" in template.source
    conv = qwen.conversation(system="Answer in one short sentence.", max_tokens=48)
    first = conv.send("What is 2 + 2?").until_done()
    assert "4" in first.text and first.stats.finish_reason == "eos"
    sid = conv.session.session_id
    second = conv.send("Now multiply that by 3.").until_done()
    assert conv.session.session_id == sid and second.stats.finish_reason == "eos"
    from_scratch = qwen.tokenize(template.render(conv.messages[:-1], add_generation_prompt=True))
    reply = list(second.token_ids)
    assert conv.session.tokens == from_scratch + reply
    conv.close()
