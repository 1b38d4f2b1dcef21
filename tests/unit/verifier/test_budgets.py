"""Draft budgets the verifier assigns (GOODSPEED, issue 17): the allocation of eq. 5 is
exact against brute force and keeps to C and the per-session bounds; the baselines
keep to C; on the toy verifier the estimates follow each session's verdicts, a
session whose acceptance drops loses budget to the others, every verdict carries
the next budget, a block past its budget is cut (lossless), and a device that
honours its budgets writes the target's own output."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from edgekit.protocol import BlockRequest, OpenRequest, Sampler, SparseDistribution, acceptance_ratios
from edgekit.testing import FakeDraftModel, ScriptedTransport, ToyLanguageModel, toy_client, toy_verifier
from edgekit.verifier._budgets import (
    BudgetState,
    FixedShare,
    GoodSpeed,
    RandomShare,
    allocate,
    capacity_within,
    expected_goodput,
)

TARGET = ToyLanguageModel(seed=31, eos_bias=-8.0)


def _objective(weights, alphas, s) -> float:
    return sum(w * expected_goodput(a, x) for w, a, x in zip(weights, alphas, s, strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_the_greedy_allocation_is_exact_against_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    lo, hi = rng.choice([(0, 5), (1, 5), (1, 3), (2, 6)])
    weights = [rng.choice([rng.uniform(0.01, 3.0), 1.0]) for _ in range(n)]
    alphas = [rng.choice([rng.random(), 0.0, 0.99, 1.0, 0.5]) for _ in range(n)]
    capacity = rng.randint(n * lo, n * hi + 2)
    got = allocate(weights, alphas, capacity, lo, hi)
    assert sum(got) <= max(capacity, n * lo) and all(lo <= s <= hi for s in got)
    best = max(
        (_objective(weights, alphas, s) for s in itertools.product(range(lo, hi + 1), repeat=n) if sum(s) <= capacity),
        default=None,
    )
    assert best is not None
    assert _objective(weights, alphas, got) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_everyone_gets_the_floor_even_past_the_capacity():
    assert allocate([1.0, 1.0, 1.0], [0.9, 0.9, 0.9], 2, 1, 8) == [1, 1, 1]


def test_log_utility_favours_the_session_with_less_goodput_and_higher_acceptance():
    states = [BudgetState(alpha=0.8, goodput=1.0), BudgetState(alpha=0.8, goodput=4.0), BudgetState(alpha=0.2)]
    s = GoodSpeed().assign(states, 12, 1, 8)
    assert sum(s) == 12 and s[0] > s[1] > s[2] == 1


@pytest.mark.parametrize("policy", [FixedShare(), RandomShare(seed=3)])
def test_the_baselines_keep_to_the_capacity_and_the_bounds(policy):
    for n, c in [(1, 7), (3, 10), (4, 4), (5, 40), (6, 3)]:
        for _ in range(20):
            s = policy.assign([BudgetState() for _ in range(n)], c, 1, 8)
            assert len(s) == n and all(1 <= x <= 8 for x in s)
            assert sum(s) <= max(c, n)
    assert FixedShare().assign([BudgetState()] * 3, 10, 1, 8) == [4, 3, 3]


def test_the_default_capacity_is_the_most_tokens_whose_predicted_pass_meets_the_tightest_slo():
    per_row = 2.0  # a toy cost model: 2 ms per row and 5 ms per pass
    predict = lambda x: 5.0 + per_row * x[0]  # noqa: E731
    slo = [BudgetState(slo_budget_ms=45.0, context=100), BudgetState(slo_budget_ms=80.0), BudgetState()]
    c = capacity_within(predict, slo, 1, 8)
    assert predict(np.array([c + 3.0])) <= 45.0 < predict(np.array([c + 4.0]))  # rows: the blocks and 3 tokens
    assert capacity_within(predict, [BudgetState(), BudgetState()], 1, 8) == 8  # no SLO: 4 each
    assert capacity_within(predict, [BudgetState(slo_budget_ms=1.0)], 1, 8) == 1  # never under the floor


def test_acceptance_ratios_are_eq_3s_terms():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 10)).astype(np.float32)
    best = np.argmax(logits, axis=1)
    block = [int(best[0]), int((best[1] + 1) % 10), int(best[2])]
    assert acceptance_ratios(logits, block).tolist() == [1.0, 0.0, 1.0]  # past the rejection too
    q = [SparseDistribution(np.arange(10, dtype=np.int32), np.full(10, 0.1, dtype=np.float32))] * 3
    sampler = Sampler(temperature=0.7)
    p = [sampler.probs(logits[j])[block[j]] for j in range(3)]
    assert acceptance_ratios(logits, block, q, sampler) == pytest.approx([min(1.0, x / 0.1) for x in p])


# -- on the toy verifier -------------------------------------------------------------------


def _budgeted(**config):
    return toy_verifier(TARGET, **({"max_block": 8, "max_context": 2048, "max_sessions": 4, "budgets": "goodspeed",
                                    "token_budget": 10} | config))


def _open(v, prompt):
    return v.open_session(
        OpenRequest(prompt, mode="greedy", seed=0, draft=FakeDraftModel(TARGET).fingerprint())
    )


def test_budgets_are_assigned_announced_and_carried_by_every_answer():
    v = _budgeted()
    info = v.handshake(FakeDraftModel(TARGET).fingerprint(), draft_model="toy", draft_hidden_size=0)
    assert info.assigns_budgets
    opened = _open(v, [1, 2, 3])
    assert 1 <= opened.next_budget <= 8
    tokens = [1, 2, 3]
    for _ in range(5):
        verdict = v.verify(BlockRequest(opened.session_id, len(tokens), TARGET.greedy(tokens, 2)))
        tokens = tokens + TARGET.greedy(tokens, verdict.accepted + 1)
        assert 1 <= verdict.next_budget <= 8
    plain = toy_verifier(TARGET)
    assert not plain.handshake(FakeDraftModel(TARGET).fingerprint(), draft_model="toy",
                               draft_hidden_size=0).assigns_budgets
    assert _open(plain, [1, 2, 3]).next_budget == 0


def _play(v, sid, tokens, budget, good: bool):
    """One round of a device drafting `budget` tokens, right (the target's own) or wrong."""
    block = TARGET.greedy(tokens, budget)
    if not good:
        block = [(t + 1) % TARGET.vocab_size or 1 for t in block]
    verdict = v.verify(BlockRequest(sid, len(tokens), block))
    return tokens + block[: verdict.accepted] + [verdict.next_token], verdict.next_budget


def test_a_session_whose_acceptance_drops_loses_budget_to_the_others():
    v = _budgeted()
    a, b = _open(v, [5, 6, 7]), _open(v, [8, 9, 10])
    ta, tb, ba, bb = [5, 6, 7], [8, 9, 10], a.next_budget, b.next_budget
    given = {"a": 0, "b": 0}
    for _ in range(60):
        ta, ba = _play(v, a.session_id, ta, ba, good=True)
        tb, bb = _play(v, b.session_id, tb, bb, good=True)
        given["a"], given["b"] = given["a"] + ba, given["b"] + bb
    states = v.service.budgets.states()
    # Both right every time: a fair split over time (gradient scheduling alternates who gets more:
    # the one whose smoothed goodput is lower has the steeper utility).
    assert states[b.session_id].alpha > 0.9 and given["a"] == pytest.approx(given["b"], rel=0.2)
    assert given["a"] + given["b"] >= 60 * 9  # and the capacity (10) is used, up to the max block (8)
    for _ in range(60):  # b's prompts change kind: its drafts are now always wrong
        ta, ba = _play(v, a.session_id, ta, ba, good=True)
        tb, bb = _play(v, b.session_id, tb, bb, good=False)
    states = v.service.budgets.states()
    # a takes what b cannot use, up to the server's max block (8); b keeps the floor and what is left.
    assert states[b.session_id].alpha < 0.05 and ba == 8 and bb == 10 - 8
    assert v.service.budgets.last_capacity == 10


def test_a_block_past_its_budget_is_cut_to_it_and_the_output_stays_the_targets():
    v = _budgeted(token_budget=4)
    a = _open(v, [1, 2, 3])
    _open(v, [4, 5, 6])
    budgets = v.service.budgets
    budget = a.next_budget  # what a was told, alone (C = 4); reassigned when b came, but a cannot know yet
    assert budget == budgets.limit(a.session_id) == 4 and budgets.states()[a.session_id].budget == 2
    tokens = [1, 2, 3]
    block = TARGET.greedy(tokens, 8)  # all right, and more than the budget
    verdict = v.verify(BlockRequest(a.session_id, 3, block))
    assert verdict.accepted == budget < len(block)  # held to what it was told; the rest was never verified
    assert verdict.next_token == TARGET.greedy(tokens, budget + 1)[-1]
    assert verdict.committed_length == 3 + budget + 1
    again = v.verify(BlockRequest(a.session_id, 3, block))  # a retry: the same answer, applied once
    assert again.committed_length == verdict.committed_length
    assert verdict.next_budget == budgets.limit(a.session_id) < budget  # the next round: the new share


@pytest.mark.parametrize("policy", ["goodspeed", "fixed", "random"])
def test_a_device_that_honours_its_budgets_writes_the_targets_own_output(policy):
    v = _budgeted(budgets=policy)
    client = toy_client(TARGET, verifier=v, max_tokens=50, draft_k=8, drafting="fixed", stop_at_eos=False)
    final = client.generate([1, 2, 3, 4]).until_done()
    assert list(final.token_ids) == TARGET.greedy([1, 2, 3, 4], 50)
    assert max(r.drafted for r in final.stats.rounds_detail) <= 8
    if policy == "fixed":  # alone, it gets all of C (up to the server's max block) until the answer's end
        assert [r.drafted for r in final.stats.rounds_detail[1:4]] == [8, 8, 8]


def test_evicted_and_idle_sessions_take_no_share():
    from edgekit.verifier import Budgets

    live = {"a", "b", "c"}
    budgets = Budgets(FixedShare(), capacity=lambda states: 12, lo=1, hi=8, is_live=live.__contains__)
    for sid in ("a", "b", "c"):
        budgets.opened(sid, context=10)
    assert budgets.after_round("a", drafted=4, ratios=4.0, committed=5, epoch=1) == 4  # 12 / 3
    live.discard("c")  # evicted by the session table, never closed
    assert budgets.after_round("a", drafted=4, ratios=4.0, committed=5, epoch=2) == 6  # 12 / 2
    assert "c" not in budgets.states()
    budgets._states["b"].seen -= 60  # b falls silent
    assert budgets.after_round("a", drafted=4, ratios=float("nan"), committed=5, epoch=3) == 8
    assert budgets.states()["b"].budget == 1 and budgets.states()["a"].alpha <= 1.0  # NaN ignored


def test_a_clients_next_session_starts_from_the_estimates_its_last_one_ended_with():
    from edgekit.verifier import Budgets

    now = [0.0]
    budgets = Budgets(GoodSpeed(), capacity=lambda states: 8, lo=1, hi=8, eta=0.5, beta=0.5, clock=lambda: now[0])
    budgets.opened("s1", context=10, client="device-a")
    for epoch in range(1, 6):
        budgets.after_round("s1", drafted=4, ratios=0.0, committed=1, epoch=epoch)  # nothing accepted
    ended = budgets.states()["s1"]
    assert ended.alpha < 0.05 and ended.goodput < 1.1
    budgets.forget("s1")
    budgets.opened("s2", context=10, client="device-a")
    budgets.opened("s3", context=10, client="device-b")  # another client starts from the prior
    budgets.opened("s4", context=10)  # and so does a session without one
    states = budgets.states()
    assert (states["s2"].alpha, states["s2"].goodput) == (ended.alpha, ended.goodput)
    assert states["s3"].alpha == states["s4"].alpha == BudgetState().alpha
    budgets.forget("s4")  # a session without a client leaves nothing behind
    assert set(budgets._clients) == {"device-a"}


def test_the_verifier_carries_a_clients_estimates_across_its_sessions_and_refuses_an_oversize_id():
    from edgekit.errors import ProtocolError

    v = _budgeted(budget_eta=0.5)
    fp = FakeDraftModel(TARGET).fingerprint()
    opened = v.open_session(OpenRequest([1, 2, 3], mode="greedy", seed=0, draft=fp, client_id="dev"))
    tokens, budget = [1, 2, 3], opened.next_budget
    for _ in range(6):
        tokens, budget = _play(v, opened.session_id, tokens, budget, good=False)
    low = v.service.budgets.states()[opened.session_id].alpha
    v.close_session(opened.session_id)
    again = v.open_session(OpenRequest([4, 5, 6], mode="greedy", seed=0, draft=fp, client_id="dev"))
    other = v.open_session(OpenRequest([4, 5, 6], mode="greedy", seed=0, draft=fp, client_id="dev2"))
    states = v.service.budgets.states()
    assert low < 0.1 and states[again.session_id].alpha == low
    assert states[other.session_id].alpha == BudgetState().alpha
    with pytest.raises(ProtocolError, match="client_id"):
        v.open_session(OpenRequest([1, 2], mode="greedy", seed=0, draft=fp, client_id="x" * 300))


def test_an_edge_client_sends_one_id_for_all_its_sessions():
    v = ScriptedTransport(_budgeted())

    def sent() -> list[str]:  # the client ids of the sessions opened so far
        return [c.arguments["request"].client_id for c in v.calls if c.method == "open_session"]

    with toy_client(TARGET, noise=0.0, verifier=v, stream_when_faster=False) as client:  # sessions, every time
        for prompt in ([1, 2, 3], [4, 5, 6]):
            list(client.generate(prompt, max_tokens=4))
    ids = sent()
    assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 32
    with toy_client(TARGET, noise=0.0, verifier=v, stream_when_faster=False) as other:
        list(other.generate([1, 2, 3], max_tokens=2))
    assert sent()[2] != ids[0]  # another client, another id
