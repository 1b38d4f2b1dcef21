"""A reopened session's context is rebuilt the way it was built (issue 52, item 1): the client
sends its history (the prompt and turns it prefilled, the tokens the rounds generated), and the
verifier prefills each prompt or turn from where it was prefilled and decodes the generated spans
as rounds decode them (exact sub-batches), so that the KV, and every logit after it, are what they
were. What the real-model test may expect: bit-identical logits, since every row is computed by
the same kernels over the same cells as before (the premise of exact numerics: a calibrated
sub-batch reproduces single rows bit for bit); a context prefilled whole instead takes batched
kernels over the generated spans, whose last bits differ."""

from __future__ import annotations

import pytest

from edgekit import ClientConfig, Resumed
from edgekit.errors import ProtocolError, VerifierUnavailableError
from edgekit.protocol import ContextSpan, OpenRequest, VerifyResult
from edgekit.testing import Call, FakeDraftModel, ScriptedTransport, ToyLanguageModel, faults, toy_client, toy_verifier
from edgekit.verifier import Feed
from edgekit.verifier._rounds import rebuild_feeds  # private: the feeds a reopen replays, which no public call returns

TARGET = ToyLanguageModel(seed=3, eos_bias=-4.0)


def test_each_span_is_fed_one_position_back_as_it_was_built():
    tokens = tuple(range(100, 120))  # a prompt of 5, 6 generated, a turn of 4, 5 generated
    history = (ContextSpan(5), ContextSpan(6, True), ContextSpan(4), ContextSpan(5, True))
    feeds = rebuild_feeds(7, tokens, history)
    assert [(f.start, len(f.tokens), f.generated) for f in feeds] == [(0, 4, False), (4, 6, True), (10, 4, False),
                                                                      (14, 5, True)]
    assert all(f.seq == 7 and f.n_out == 0 and f.tokens == tokens[f.start : f.start + len(f.tokens)] for f in feeds)
    # the last committed token is never run: the next round's first row is
    assert feeds[-1].start + len(feeds[-1].tokens) == len(tokens) - 1


def test_without_a_history_the_context_is_one_prompt():
    assert rebuild_feeds(0, (1, 2, 3), ()) == [Feed(0, 0, (1, 2), 0)]
    assert rebuild_feeds(0, (1,), ()) == [Feed(0, 0, (), 0)]
    assert rebuild_feeds(0, (1, 2), (ContextSpan(1), ContextSpan(1, True))) == [Feed(0, 0, (1,), 0, generated=True)]


@pytest.mark.parametrize(
    "spans, message",
    [((ContextSpan(3), ContextSpan(3, True)), "spans 6 tokens; the prompt has 5"),
     ((ContextSpan(5), ContextSpan(0, True)), "is empty"),
     (tuple(ContextSpan(1) for _ in range(6)), "6 spans for 5 tokens")],
)
def test_a_history_that_is_not_the_prompts_is_refused(spans, message):
    verifier = toy_verifier(TARGET)
    draft = FakeDraftModel(TARGET)
    verifier.handshake(draft.fingerprint(), draft_model="toy", draft_hidden_size=8)
    with pytest.raises(ProtocolError, match=message):
        verifier.open_session(OpenRequest([5, 6, 7, 8, 9], mode="greedy", seed=0, draft=draft.fingerprint(),
                                          history=spans))
    assert len(verifier.service.sessions) == 0


def _restart(call: Call) -> VerifyResult:
    call.transport.inner = toy_verifier(TARGET)
    raise VerifierUnavailableError("restarting", address=call.transport.address)


def test_a_reopened_session_tells_the_verifier_how_its_context_was_built():
    """A prompt, an answer, a turn, part of an answer, then the verifier restarts: the session is
    reopened with its history, span by span, and the conversation is the uninterrupted one."""
    config = ClientConfig(retry_for=5.0, retry_initial=0.001, retry_max=0.002)

    def conversation(transport: ScriptedTransport) -> tuple[list[int], list, tuple[int, int], int]:
        client = toy_client(TARGET, noise=1.5, verifier=transport, config=config, draft_k=4, max_tokens=20,
                            stop_at_eos=False)
        prompt, turn = client.tokenize("a prompt"), client.tokenize("a turn", special=False)
        session = client.session()
        session.open(prompt)
        list(session.stream())
        rounds = transport.count("verify")  # before the turn
        session.extend(turn)
        events = list(session.stream())
        answered = len(session.tokens) - len(prompt) - len(turn)  # both answers, all the rounds committed
        history = session.history()
        assert [s.generated for s in history] == [False, True, False, True]
        assert (history[0].length, history[2].length, history[1].length + history[3].length) == (
            len(prompt), len(turn), answered)
        return session.tokens, events, (len(prompt), len(turn)), rounds

    reference, _, _, rounds = conversation(ScriptedTransport(toy_verifier(TARGET), config=config))
    # the verifier restarts during the second answer
    restart = faults({"verify": {rounds + 3: _restart}})
    transport = ScriptedTransport(toy_verifier(TARGET), handler=restart, config=config)
    tokens, events, (prompt, turn), _ = conversation(transport)
    assert tokens == reference
    (resumed,) = [e for e in events if isinstance(e, Resumed)]
    (reopened,) = transport.inner.open_calls  # the restarted verifier's only open: the reopen
    spans = [(s.length, s.generated) for s in reopened.history]
    assert [g for _, g in spans] == [False, True, False, True] and (spans[0][0], spans[2][0]) == (prompt, turn)
    assert sum(n for n, _ in spans) == resumed.reprefilled_tokens == len(reopened.prompt_tokens)
