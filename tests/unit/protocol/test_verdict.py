"""The verdict, the one rule every verifier path applies (edgekit.protocol.decide),
and the top-1 acceptance rule the stock servers verify with."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit import StaleRoundError
from edgekit.protocol import accept_greedy, accept_top1, check_base, decide

EOS = 1


def _decide(block, accepted, nxt, *, base=10, max_context=100, go_on=False):
    return decide(block, accepted, nxt, base=base, max_context=max_context, is_end=lambda t: t == EOS,
                  continue_after_eog=go_on)


def test_a_verdict_commits_the_accepted_prefix_and_the_next_token():
    v = _decide([5, 6, 7], 2, 9)
    assert (v.accepted, v.next_token, v.bonus, v.committed, v.committed_length) == (2, 9, False, (5, 6, 9), 13)
    v = _decide([5, 6, 7], 3, 9)  # all accepted: the next token is the bonus
    assert (v.bonus, v.committed, v.committed_length) == (True, (5, 6, 7, 9), 14)
    v = _decide([], 0, 4)  # an empty block: one target step
    assert (v.accepted, v.committed, v.bonus) == (0, (4,), True)


def test_an_accepted_end_token_ends_the_text_unless_the_round_goes_on():
    v = _decide([5, EOS, 7], 3, 9)
    assert (v.accepted, v.next_token, v.bonus, v.committed) == (2, None, False, (5, EOS))
    v = _decide([5, EOS, 7], 1, 9)  # the end token was not accepted: nothing to cut
    assert v.committed == (5, 9)
    v = _decide([5, EOS, 7], 3, 9, go_on=True)
    assert v.committed == (5, EOS, 7, 9) and v.bonus


@pytest.mark.parametrize("base, full", [(95, False), (96, False), (97, True)])
def test_context_full_when_another_round_of_one_cannot_fit(base, full):
    # the round commits 2 tokens; another round needs room for a block of 1 and its next token
    assert _decide([5], 1, 9, base=base, max_context=100).context_full is full


def test_a_stale_base_is_refused_with_the_committed_length():
    check_base(7, 7)
    with pytest.raises(StaleRoundError, match="stale round: base position 6 but the session has 7") as info:
        check_base(6, 7, address="here")
    assert (info.value.committed_length, info.value.address) == (7, "here")


def test_top1_acceptance_is_greedy_acceptance_on_the_argmaxes():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(0, 6))
        logits = rng.normal(size=(k + 1, 8)).astype(np.float32)
        best = np.argmax(logits, axis=1).tolist()
        block = [b if rng.random() < 0.7 else (b + 1) % 8 for b in best[:k]]
        assert accept_greedy(logits, block) == accept_top1(best, block)


def test_top1_from_a_server_may_stop_at_the_first_mismatch_but_not_before():
    assert accept_top1([5, 3], [5, 6, 7]) == (1, 3)  # stopped at the mismatch: enough
    assert accept_top1([5, 6], [5, 6, 7]) == (2, None)  # stopped short of the deciding position
