"""Proactive drafting (issue 18, item 3): while a block is verified the device drafts the next
one as if all of it will be accepted. Lossless with any draft; a verdict that takes the whole
block and the guessed token starts the next round with what was drafted; the drafting
overlaps the verify call; the stats count what was drafted, used and wasted."""

from __future__ import annotations

import threading
import time

import pytest

from edgekit import EdgeClient, GenerationConfig
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_verifier

TARGET = ToyLanguageModel(seed=41, eos_bias=-8.0)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9]]


def _slow(transport, seconds: float = 0.005):
    """The verifier answering after `seconds` (a round trip), so that drafting ahead has time to run."""
    verify = transport.verify

    def slow_verify(block):
        time.sleep(seconds)
        return verify(block)

    transport.verify = slow_verify
    return transport


def _run(draft_lm: ToyLanguageModel, proactive: bool, prompt: list[int], **gen):
    config = GenerationConfig(max_tokens=40, drafting="fixed", draft_k=4, proactive=proactive, **gen)
    with EdgeClient(_slow(toy_verifier(TARGET)), draft_model=FakeDraftModel(draft_lm), generation=config) as client:
        return client.generate(prompt).until_done()


@pytest.mark.parametrize("noise", [0.0, 0.8, 50.0])
def test_output_is_the_targets_own_with_any_draft(noise):
    draft = ToyLanguageModel(seed=41, noise=noise) if noise else TARGET
    for prompt in PROMPTS:
        with_ahead = _run(draft, True, prompt)
        assert list(with_ahead.token_ids) == TARGET.greedy(prompt, 40)
        assert with_ahead.token_ids == _run(draft, False, prompt).token_ids


def test_with_a_perfect_draft_everything_drafted_ahead_is_used():
    s = _run(TARGET, True, PROMPTS[0]).stats
    assert s.proactive_drafted > 20 and s.proactive_wasted <= 5  # the last round's draft-ahead may go unused
    assert s.proactive_used == s.proactive_drafted - s.proactive_wasted
    plain = _run(TARGET, False, PROMPTS[0]).stats
    assert plain.proactive_drafted == 0 and plain.rounds == s.rounds  # the same rounds, their blocks drafted earlier


def test_with_a_draft_that_never_agrees_everything_drafted_ahead_is_dropped():
    s = _run(ToyLanguageModel(seed=99, noise=50.0), True, PROMPTS[1]).stats
    assert s.proactive_drafted > 0 and s.proactive_used == 0 and s.proactive_wasted == s.proactive_drafted
    assert s.to_dict()["proactive_wasted"] == s.proactive_wasted


def test_the_draft_works_while_the_verify_call_is_out():
    events: list[tuple[str, float]] = []
    lock = threading.Lock()

    class SlowDraft(FakeDraftModel):
        def eval(self, tokens, *, hidden=False):
            with lock:
                events.append(("draft", time.perf_counter()))
            return super().eval(tokens, hidden=hidden)

    transport = toy_verifier(TARGET)
    verify = transport.verify

    def slow_verify(block):
        with lock:
            events.append(("sent", time.perf_counter()))
        time.sleep(0.05)  # a 50 ms round trip
        result = verify(block)
        with lock:
            events.append(("answered", time.perf_counter()))
        return result

    transport.verify = slow_verify  # type: ignore[method-assign]
    config = GenerationConfig(max_tokens=12, drafting="fixed", draft_k=3, proactive=True)
    with EdgeClient(transport, draft_model=SlowDraft(TARGET), generation=config) as client:
        client.generate(PROMPTS[0]).until_done()
    inside, out = 0, False
    for kind, _ in events:
        out = kind == "sent" or (out and kind != "answered")
        inside += kind == "draft" and out
    assert inside >= 3  # draft steps ran while a block was out for verification


def test_drafting_ahead_through_outages_drafts_proactively_too():
    from edgekit import ClientConfig

    config = GenerationConfig(max_tokens=40, drafting="fixed", draft_k=4, proactive=True)
    with EdgeClient(_slow(toy_verifier(TARGET)), draft_model=FakeDraftModel(TARGET), generation=config,
                    config=ClientConfig(on_disconnect="draft")) as client:
        final = client.generate(PROMPTS[0]).until_done()
    assert list(final.token_ids) == TARGET.greedy(PROMPTS[0], 40)
    assert final.stats.proactive_drafted > 20 and final.stats.proactive_used >= final.stats.proactive_drafted - 5


def test_drafting_ahead_stops_once_the_verdict_is_in():
    class SlowDraft(FakeDraftModel):  # 20 ms a step, against a verifier that answers at once
        def eval(self, tokens, *, hidden=False):
            time.sleep(0.02)
            return super().eval(tokens, hidden=hidden)

    config = GenerationConfig(max_tokens=24, drafting="fixed", draft_k=4, proactive=True)
    with EdgeClient(toy_verifier(TARGET), draft_model=SlowDraft(TARGET), generation=config) as client:
        final = client.generate(PROMPTS[0]).until_done()
    assert list(final.token_ids) == TARGET.greedy(PROMPTS[0], 24)
    # Each round's verdict comes before the draft's first step ahead is done: at most the guess and
    # the step under way, never the whole next block (1 + 4 tokens).
    assert final.stats.proactive_drafted <= 2 * final.stats.rounds
