"""Speculation off when it does not pay (issue 18, item 5): with a draft that never agrees
with the target, the latency model soon expects plain target decoding (an empty block: one
round trip and one target step per token) to be faster and the session switches to it,
probing with a short block now and then; with a draft that agrees it keeps drafting. The
output is the target's own either way.

The scenario's times are modelled, not measured: a draft step costs 3 ms (as a small
model's on a device), a verification 1 ms, and the link's RTT is 5 ms (`SimulatedLink`).
The session's cost tracker is told those (`modelled_costs`) in place of what this
machine's clock saw, so the gate decides on the scenario, never on how fast or loaded
the machine running the toy models is."""

from __future__ import annotations

import pytest

from edgekit.drafting import FixedWindow, PlainWhenFaster
from edgekit.link import CostTracker
from edgekit.testing import SimulatedLink, ToyLanguageModel, toy_client, toy_verifier

TARGET = ToyLanguageModel(seed=17, eos_bias=-8.0)
NEVER = ToyLanguageModel(seed=1234, noise=50.0)  # a draft whose tokens the target (almost) never takes
DRAFT_STEP_MS, VERIFY_MS = 3.0, 1.0


@pytest.fixture()
def modelled_costs(monkeypatch):
    """Rounds are observed with the modelled draft and verification times."""
    observe = CostTracker.observe

    def modelled(self, *, draft_ms, draft_steps, verify_ms, **rest):
        observe(self, draft_ms=DRAFT_STEP_MS * draft_steps, draft_steps=draft_steps, verify_ms=VERIFY_MS, **rest)

    monkeypatch.setattr(CostTracker, "observe", modelled)


def _final(draft_lm: ToyLanguageModel, **gen):
    verifier = toy_verifier(TARGET, link=SimulatedLink(rtt_ms=5.0))
    with toy_client(TARGET, draft=draft_lm, verifier=verifier, max_tokens=80, drafting="latency", **gen) as client:
        stream = client.generate([1, 2, 3])
        return stream.until_done()


@pytest.mark.usefixtures("modelled_costs")
def test_a_draft_that_never_agrees_is_switched_off_and_probed_now_and_then():
    final = _final(NEVER)
    s = final.stats
    assert list(final.token_ids) == TARGET.greedy([1, 2, 3], 80)
    assert s.plain_rounds > 0.6 * s.rounds  # most rounds plain
    drafted_rounds = [r for r in s.rounds_detail if r.drafted]
    assert drafted_rounds and all(r.drafted <= 2 for r in drafted_rounds[-3:])  # the probes are short blocks
    off = _final(NEVER, plain_when_faster=False).stats
    assert off.plain_rounds == 0 and off.drafted > s.drafted


@pytest.mark.usefixtures("modelled_costs")
def test_a_clients_next_generation_decides_from_its_first_round_on_what_the_last_one_measured():
    """The client carries its cost estimate across generations (per mode): where the first answer
    learnt that plain decoding wins, the next one goes plain from its first round instead of
    drafting through another warm-up (what a GPU verifier, faster than the device's draft, showed:
    benchmarks/gpu/README.md)."""
    verifier = toy_verifier(TARGET, link=SimulatedLink(rtt_ms=5.0))
    with toy_client(TARGET, draft=NEVER, verifier=verifier, max_tokens=40, drafting="latency") as client:
        first = client.generate([1, 2, 3]).until_done().stats
        second = client.generate([4, 5, 6]).until_done()
    assert first.rounds_detail[0].drafted > 0 and first.plain_rounds > 0  # a warm-up, then plain
    assert second.stats.rounds_detail[0].drafted == 0  # plain at once
    assert second.stats.plain_rounds > first.plain_rounds
    assert list(second.token_ids) == TARGET.greedy([4, 5, 6], 40)


@pytest.mark.usefixtures("modelled_costs")
def test_a_draft_that_agrees_keeps_drafting():
    final = _final(TARGET)
    assert list(final.token_ids) == TARGET.greedy([1, 2, 3], 80)
    assert final.stats.plain_rounds == 0 and final.stats.drafted > 0.5 * final.stats.completion_tokens


def test_the_gate_only_decides_on_measurements_and_probes_on_schedule():
    from edgekit.config import GenerationConfig as G
    from edgekit.link import LinkEstimator, LinkPolicy

    policy = LinkPolicy(G(), LinkEstimator(), hidden_dim=8, n_vocab=64)
    gate = PlainWhenFaster(FixedWindow(4), policy, probe_every=3, probe_window=2, warmup=2)
    assert gate.window(8) == 4  # no verdicts yet: as the inner controller
    for _ in range(12):  # nothing accepted, drafting slow
        policy.costs.observe(drafted=4, accepted=0, draft_ms=80.0, draft_steps=4, verify_ms=10.0)
        gate.observe(4, 0)
    windows = []
    for _ in range(8):
        w = gate.window(8)
        assert gate.window(8) == w  # asked again within the round (a block drafted ahead): the same answer
        windows.append(w)
        gate.observe(w, 0)
    assert windows == [0, 0, 0, 2, 0, 0, 0, 2]
    assert gate.plain_rounds == 6
    for _ in range(30):  # then the draft agrees again, and is fast
        policy.costs.observe(drafted=4, accepted=4, draft_ms=2.0, draft_steps=4, verify_ms=10.0)
        gate.observe(4, 4)
    assert gate.window(8) == 4


@pytest.mark.usefixtures("modelled_costs")
def test_with_proactive_drafting_a_round_is_counted_once_and_nothing_is_drafted_ahead_of_a_plain_round():
    final = _final(NEVER, proactive=True)
    s = final.stats
    assert list(final.token_ids) == TARGET.greedy([1, 2, 3], 80)
    empty = sum(1 for r in s.rounds_detail if r.drafted == 0)
    assert s.plain_rounds == empty > 0.6 * s.rounds
    assert s.proactive_drafted <= 5 * (s.rounds - empty + 1)  # only past rounds that drafted
