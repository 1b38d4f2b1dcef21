"""Proactive drafting (issue 18, item 3): while a block is verified the device drafts the next
one as if all of it will be accepted. Lossless with any draft; a verdict that takes the whole
block and the guessed token starts the next round with what was drafted; the drafting
overlaps the verify call; the stats count what was drafted, used and wasted.

Which of the two comes first, the verdict or the drafting ahead, is up to the machine's
scheduler; tests that count what was drafted ahead decide it with events instead (`_watch`):
a verdict held until the device asks for it, or a draft step that waits for the verdict."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from edgekit.client import _round as round_module
from edgekit.testing import Call, FakeDraftModel, ScriptedTransport, ToyLanguageModel, toy_client, toy_verifier

TARGET = ToyLanguageModel(seed=41, eos_bias=-8.0)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9]]


def _round_trip(call: Call) -> Any:
    """A verdict comes 5 ms after its block was sent (a round trip): drafting ahead races it."""
    if call.method == "verify":
        time.sleep(0.005)
    return call.forward()


def _watch(monkeypatch, *, hold: bool) -> SimpleNamespace:
    """Watches the verify calls the session runs on a thread of their own while it drafts ahead:
    `.out` is the call the device has sent and not yet asked the verdict of (None between calls).
    With `hold`, a call's verdict is held until the device asks for it (waits on it, or takes its
    result; a glance to see whether it is in does not count): whatever the device drafts before
    that, it drafts while the call is out, however the machine schedules the two threads."""
    calls = SimpleNamespace(out=None)

    class Watched(round_module.Background):
        def __init__(self, call):
            self.asked = threading.Event()

            def held():
                if hold and not self.asked.wait(30):
                    raise AssertionError("the device did not ask for the verdict within 30 s")
                return call()

            super().__init__(held)
            calls.out = self

        def wait(self, timeout=None):
            if timeout is None or timeout > 0:
                self.asked.set()
            return super().wait(timeout)

        def result(self):
            self.asked.set()
            calls.out = None
            return super().result()

    monkeypatch.setattr(round_module, "Background", Watched)
    return calls


def _run(draft_lm: ToyLanguageModel, proactive: bool, prompt: list[int], *, race: bool = True, **gen):
    """A generation; with `race`, each verdict comes after a 5 ms round trip, racing the drafting ahead."""
    verifier = ScriptedTransport(toy_verifier(TARGET), handler=_round_trip) if race else toy_verifier(TARGET)
    with toy_client(TARGET, draft=draft_lm, verifier=verifier, max_tokens=40, drafting="fixed", draft_k=4,
                    proactive=proactive, **gen) as client:
        return client.generate(prompt).until_done()


@pytest.mark.parametrize("noise", [0.0, 0.8, 50.0])
def test_output_is_the_targets_own_with_any_draft(noise):
    draft = ToyLanguageModel(seed=41, noise=noise) if noise else TARGET
    for prompt in PROMPTS:
        with_ahead = _run(draft, True, prompt)
        assert list(with_ahead.token_ids) == TARGET.greedy(prompt, 40)
        assert with_ahead.token_ids == _run(draft, False, prompt).token_ids


def test_with_a_perfect_draft_everything_drafted_ahead_is_used(monkeypatch):
    _watch(monkeypatch, hold=True)  # every verdict comes once the next block is drafted
    s = _run(TARGET, True, PROMPTS[0], race=False).stats
    assert s.proactive_drafted > 20 and s.proactive_wasted <= 5  # the last round's draft-ahead may go unused
    assert s.proactive_used == s.proactive_drafted - s.proactive_wasted
    plain = _run(TARGET, False, PROMPTS[0], race=False).stats
    assert plain.proactive_drafted == 0 and plain.rounds == s.rounds  # the same rounds, their blocks drafted earlier


def test_with_a_draft_that_never_agrees_everything_drafted_ahead_is_dropped(monkeypatch):
    _watch(monkeypatch, hold=True)
    s = _run(ToyLanguageModel(seed=99, noise=50.0), True, PROMPTS[1], race=False).stats
    assert s.proactive_drafted > 0 and s.proactive_used == 0 and s.proactive_wasted == s.proactive_drafted
    assert s.to_dict()["proactive_wasted"] == s.proactive_wasted


def test_the_draft_works_while_the_verify_call_is_out(monkeypatch):
    calls = _watch(monkeypatch, hold=True)  # a verdict comes only once the device asks for it
    steps: list[bool] = []  # per draft step: whether a block was out for verification meanwhile
    answered: list[bool] = []  # per verify call: whether the device had asked for its verdict

    class Draft(FakeDraftModel):
        def eval(self, tokens, *, hidden=False):
            steps.append(calls.out is not None)
            return super().eval(tokens, hidden=hidden)

    def watched(call: Call) -> Any:
        if call.method == "verify":
            answered.append(calls.out is None or calls.out.asked.is_set())
        return call.forward()

    transport = ScriptedTransport(toy_verifier(TARGET), handler=watched)
    with toy_client(TARGET, draft=Draft(TARGET), verifier=transport, max_tokens=12, drafting="fixed", draft_k=3,
                    proactive=True) as client:
        final = client.generate(PROMPTS[0]).until_done()
    assert list(final.token_ids) == TARGET.greedy(PROMPTS[0], 12)
    assert all(answered)  # no verdict came before the device asked for it ...
    assert sum(steps) >= 3  # ... and draft steps ran while a block was out for verification


def test_drafting_ahead_through_outages_drafts_proactively_too(monkeypatch):
    from edgekit import ClientConfig

    _watch(monkeypatch, hold=True)  # every verdict comes once the next block is drafted
    with toy_client(TARGET, noise=0.0, config=ClientConfig(on_disconnect="draft", draft_ahead_after=60.0),
                    max_tokens=40, drafting="fixed", draft_k=4, proactive=True) as client:
        final = client.generate(PROMPTS[0]).until_done()
    assert list(final.token_ids) == TARGET.greedy(PROMPTS[0], 40)
    assert final.stats.proactive_drafted > 20 and final.stats.proactive_used >= final.stats.proactive_drafted - 5


def test_drafting_ahead_stops_once_the_verdict_is_in(monkeypatch):
    calls = _watch(monkeypatch, hold=False)

    class SlowDraft(FakeDraftModel):  # a step drafted ahead takes until the verdict is in, however long that is
        def eval(self, tokens, *, hidden=False):
            out = calls.out
            if out is not None:
                assert out.wait(30), "no verdict within 30 s"
            return super().eval(tokens, hidden=hidden)

    with toy_client(TARGET, draft=SlowDraft(TARGET), max_tokens=24, drafting="fixed", draft_k=4,
                    proactive=True) as client:
        final = client.generate(PROMPTS[0]).until_done()
    assert list(final.token_ids) == TARGET.greedy(PROMPTS[0], 24)
    # Each round's verdict comes before the draft's first step ahead is done: at most the guess and
    # the step under way, never the whole next block (1 + 4 tokens).
    assert final.stats.proactive_drafted <= 2 * final.stats.rounds
