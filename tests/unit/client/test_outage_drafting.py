"""Drafting through an outage, on the toy verifier: while no verifier answers, the
device drafts ahead and streams it as provisional; when one answers again, the
accepted prefix is kept and the rest replaced by the target's tokens, so output
stays token-identical to target-only decoding. Also the chain's bookkeeping, the
sampling argument behind keeping a chain past a whole-block verdict, and the chat's
dimmed provisional text. The measurement with the link emulator is
benchmarks/outage.py."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy.stats import chisquare

from edgekit import ClientConfig, EdgeClient, FinalStats, Provisional, Resumed, TextDelta
from edgekit.client._ahead import DraftChain, DraftedBlock
from edgekit.client._drafter import Drafter
from edgekit.errors import VerifierUnavailableError
from edgekit.protocol import Sampler, SparseDistribution, accept_sampling
from edgekit.testing import Call, ScriptedTransport, ToyLanguageModel, toy_client, toy_verifier

FAST = dict(retry_for=60.0, retry_initial=0.01, retry_max=0.05)
HOLD_S = 30.0  # the longest an outage waits for the event that ends it before the test fails


class Outage:
    """A link to the toy verifier that goes away at the `at`-th Verify, as the handler of a
    `ScriptedTransport`: "reset" refuses every call meanwhile (a restart, an interface down);
    "silent" holds the call and answers once the link is back (packets dropped and retransmitted).

    The link comes back on an event, never after a while (so much happens during the outage on
    any machine, loaded or not): once the device has drafted all it may ahead (`drafted_all`, told
    by `_chain_full_ends_the_outage`), after `refusals` refused calls where given, or at `restore()`."""

    def __init__(self, *, at: int, kind: str, refusals: int | None = None):
        _OUTAGES.append(self)
        self.at, self.kind, self.refusals = at, kind, refusals
        self.refused = 0
        self.down = False
        self.full = False  # the device's chain was full while the link was down
        self.restored = False
        self.answered = threading.Event()  # the held call ("silent") got its verdict
        self.blocks: list[int] = []
        self._changed = threading.Condition()

    def _back(self) -> bool:
        return self.restored or self.full or (self.refusals is not None and self.refused >= self.refusals)

    def drafted_all(self) -> None:
        with self._changed:
            if self.down:
                self.full = True
                self._changed.notify_all()

    def restore(self) -> None:
        with self._changed:
            self.restored = True
            self._changed.notify_all()

    def __call__(self, call: Call) -> Any:
        if call.method != "verify":
            return call.forward()
        with self._changed:
            if call.n == self.at:
                self.down, self._began = True, time.monotonic()
            if self.down and not self._back():
                if self.kind == "reset":
                    assert time.monotonic() - self._began < HOLD_S, "the outage did not end within 30 s"
                    self.refused += 1
                    raise VerifierUnavailableError("connection refused", address=call.transport.address)
                assert self._changed.wait_for(self._back, timeout=HOLD_S), "the outage did not end within 30 s"
            held, self.down = self.down, False
        self.blocks.append(len(call.arguments["block"].draft_tokens))
        answer = call.forward()
        if held:
            self.answered.set()
        return answer


_OUTAGES: list[Outage] = []  # this test's


@pytest.fixture(autouse=True)
def _chain_full_ends_the_outage(monkeypatch):
    """Tells an `Outage` when the device has drafted all it may ahead: `Drafter.ahead` found the
    chain as long as it may be (`ahead` tokens, the context, an end of text)."""
    draft_ahead = Drafter.ahead

    def watched(self, limit, ahead):
        event = draft_ahead(self, limit, ahead)
        if event is None:
            for outage in _OUTAGES:
                outage.drafted_all()
        return event

    monkeypatch.setattr(Drafter, "ahead", watched)
    yield
    _OUTAGES.clear()


def _target() -> ToyLanguageModel:
    return ToyLanguageModel(seed=3, eos_bias=-4.0)


def _client(link: Callable[[Call], Any], *, noise: float, config: dict[str, Any] | None = None, **gen) -> EdgeClient:
    """A client of the toy verifier behind `link` (an `Outage`, the handler of its transport), drafting
    ahead through an outage after 50 ms, with a draft of `noise`; it writes past an end of text."""
    cfg = ClientConfig(**({"on_disconnect": "draft", "draft_ahead_after": 0.05} | FAST | (config or {})))
    transport = ScriptedTransport(toy_verifier(_target()), handler=link, config=cfg)
    return toy_client(_target(), noise=noise, verifier=transport, config=cfg, stop_at_eos=False, **gen)


def _run(*, noise: float, kind: str = "reset", on_disconnect: str = "draft", refusals: int | None = None,
         max_tokens: int = 60, **config) -> tuple[list, Outage]:
    outage = Outage(at=3, kind=kind, refusals=refusals)
    client = _client(outage, noise=noise, config={"on_disconnect": on_disconnect} | config, draft_k=4,
                     max_tokens=max_tokens)
    return list(client.generate("through the outage")), outage


def _reference(max_tokens: int = 60) -> tuple[int, ...]:
    client = toy_client(_target(), noise=0.0, max_tokens=max_tokens, stop_at_eos=False)
    return client.generate_target_only("through the outage").until_done().token_ids


@pytest.mark.parametrize("kind", ["reset", "silent"])
@pytest.mark.parametrize("noise", [0.0, 1.5])
def test_drafting_through_an_outage_is_lossless(kind, noise):
    events, _ = _run(noise=noise, kind=kind)
    final = events[-1]
    assert isinstance(final, FinalStats)
    assert final.token_ids == _reference()  # the provisional tokens never reached the output unverified
    provisional = [e for e in events if isinstance(e, Provisional)]
    assert provisional and max(len(p.token_ids) for p in provisional) > 8
    assert final.stats.provisional_tokens >= max(len(p.token_ids) for p in provisional)
    assert 0 <= final.stats.provisional_kept <= final.stats.provisional_tokens
    assert [isinstance(e, Resumed) for e in events].count(True) == (kind == "reset")
    # Each Provisional holds what is drafted past the output at that moment: with a draft that is
    # always right, the output so far followed by it is the reference's beginning.
    out: list[int] = []
    for e in events:
        if isinstance(e, TextDelta):
            out += e.token_ids
        elif isinstance(e, Provisional) and e.token_ids and noise == 0.0:
            assert tuple(out) + e.token_ids == _reference()[: len(out) + len(e.token_ids)]


def test_with_a_draft_that_is_always_right_every_provisional_token_is_kept():
    events, outage = _run(noise=0.0)
    final = events[-1]
    assert final.stats.provisional_tokens > 8
    assert final.stats.provisional_kept == final.stats.provisional_tokens
    # Sent as the controller cut them, one block per round after the outage: no block past draft_k.
    assert max(outage.blocks) <= 4
    last_provisional = [e for e in events if isinstance(e, Provisional)][-1]
    assert last_provisional.token_ids == ()  # the stream says when nothing is ahead any more


def test_provisional_tokens_past_the_first_mistake_are_replaced_by_the_targets():
    events, _ = _run(noise=3.0)
    final = events[-1]
    assert final.token_ids == _reference()
    assert final.stats.provisional_kept < final.stats.provisional_tokens  # a noisy draft loses some


def test_drafting_ahead_stops_at_the_cap_and_at_the_answers_length():
    events, _ = _run(noise=0.0, max_provisional=10)
    assert max(len(e.token_ids) for e in events if isinstance(e, Provisional)) <= 10
    # The outage begins at the third round, after two rounds of five tokens: 14 are left to write.
    events, _ = _run(noise=0.0, max_tokens=24)
    assert 0 < max(len(e.token_ids) for e in events if isinstance(e, Provisional)) <= 14
    assert events[-1].token_ids == _reference(24)


def test_wait_retries_without_drafting_and_fail_gives_up_at_once():
    events, _ = _run(noise=1.5, on_disconnect="wait", refusals=3)  # back after three refused tries
    assert not [e for e in events if isinstance(e, Provisional)]
    assert events[-1].token_ids == _reference()
    with pytest.raises(VerifierUnavailableError):
        _run(noise=1.5, on_disconnect="fail")


def test_a_verifier_that_answers_in_time_never_sees_provisional_tokens():
    client = _client(Outage(at=10**6, kind="reset"), noise=1.5, config={"draft_ahead_after": 60.0}, max_tokens=40)
    events = list(client.generate("through the outage"))
    assert not [e for e in events if isinstance(e, Provisional)]
    assert events[-1].stats.provisional_tokens == 0


def test_the_verify_call_runs_beside_the_drafting():
    """While the call is silent the device drafts: the call is on another thread."""
    seen: list[str] = []
    outage = Outage(at=2, kind="silent")

    def spy(call: Call) -> Any:
        if call.method == "verify":
            seen.append(threading.current_thread().name)
        return outage(call)

    _client(spy, noise=0.0, max_tokens=30).generate("through the outage").until_done()
    assert seen and all(name == "edgekit-verify" for name in seen)


# -- the chain ------------------------------------------------------------------------


def _block(tokens, ms=4.0, steps=None):
    return DraftedBlock(list(tokens), draft_ms=ms, steps=len(tokens) if steps is None else steps)


def test_a_whole_block_and_its_guess_leave_the_rest_of_the_chain_standing():
    chain = DraftChain(base=10)
    chain.add(_block([1, 2, 3]))
    chain.add(_block([4, 5, 6, 7], ms=8.0))  # guess 4, then the block 5 6 7
    assert chain.front(8).tokens == [1, 2, 3]
    assert chain.advance(3, 3, 4) == 4  # all accepted, the verifier's token is the guess
    assert (chain.base, chain.tokens, chain.ends) == (14, [5, 6, 7], [3])
    front = chain.front(8)
    assert front.tokens == [5, 6, 7] and front.draft_ms == 8.0
    assert chain.advance(3, 1, 9) == 1  # a mismatch: the rest is void
    assert (chain.base, chain.tokens, chain.ends) == (16, [], [])


def test_a_block_cut_short_keeps_the_rest_as_a_block():
    chain = DraftChain(base=0)
    chain.add(_block([1, 2, 3, 4, 5], ms=10.0, steps=6))
    front = chain.front(2)
    assert front.tokens == [1, 2] and front.draft_ms == pytest.approx(4.0)
    assert chain.advance(2, 2, 3) == 3  # token 3 was the guess of the cut
    assert chain.tokens == [4, 5] and chain.ends == [2] and chain.front(8).draft_ms == pytest.approx(6.0)
    assert chain.advance(2, 2, 7) == 2 and chain.tokens == []  # no guess: the verifier's token ends the chain
    empty = DraftChain(base=5)
    empty.add(_block([], steps=1))  # a controller may stop before the first token
    assert empty.front(4).tokens == [] and empty.front(4).steps == 1


# -- sampling: keeping a chain past a whole-block verdict is lossless -------------------


def test_a_chain_kept_when_the_bonus_equals_the_drafted_guess_commits_tokens_distributed_as_the_target():
    """Draft x1 ~ q, guess g ~ q(.|x1), x3 ~ q(.|x1,g); verify [x1]; if it is accepted and the
    verifier's next token is g, verify [x3] next, else draft again from what was committed.
    The first three committed tokens must be distributed as the target's (chi-square, p > 0.001)."""
    vocab, trials = 4, 40_000
    rng = np.random.default_rng(11)
    logits = {}

    def p_logits(ctx):
        if ctx not in logits:
            logits[ctx] = rng.normal(0, 1.2, vocab).astype(np.float32)
        return logits[ctx]

    qs = {}

    def q(ctx):
        if ctx not in qs:
            probs = rng.dirichlet(np.ones(vocab)).astype(np.float32)
            qs[ctx] = SparseDistribution(np.arange(vocab, dtype=np.int32), probs)
        return qs[ctx]

    def round_(ctx, block, dists, draw):
        rows = np.stack([p_logits(ctx + tuple(block[:i])) for i in range(len(block) + 1)])
        a, nxt = accept_sampling(rows, block, dists, Sampler(temperature=1.0), draw)
        return list(block[:a]) + [nxt], a == len(block)

    draw = np.random.default_rng(12)
    counts = np.zeros((vocab,) * 3)
    for _ in range(trials):
        x1 = q(()).sample(draw)
        g = q((x1,)).sample(draw)
        x3 = q((x1, g)).sample(draw)
        out, whole = round_((), [x1], [q(())], draw)
        if whole and out[-1] == g:
            more, _ = round_(tuple(out), [x3], [q(tuple(out))], draw)
            out += more
        while len(out) < 3:  # rounds drafting afresh
            y = q(tuple(out)).sample(draw)
            more, _ = round_(tuple(out), [y], [q(tuple(out))], draw)
            out += more
        counts[tuple(out[:3])] += 1
    exact = np.zeros_like(counts)
    for a in range(vocab):
        for b in range(vocab):
            for c in range(vocab):
                exact[a, b, c] = (Sampler().probs(p_logits(()))[a] * Sampler().probs(p_logits((a,)))[b]
                                  * Sampler().probs(p_logits((a, b)))[c])
    assert chisquare(counts.ravel(), exact.ravel() / exact.sum() * trials).pvalue > 1e-3


# -- the chat's dimmed text -------------------------------------------------------------


def test_the_chat_takes_back_provisional_text_over_wrapped_lines():
    from rich.console import Console

    from edgekit.cli.chat import _ProvisionalText

    buf = io.StringIO()
    out = Console(file=buf, force_terminal=True, width=10)
    ahead = _ProvisionalText(out)
    ahead.printed("hello ")  # the answer so far: the cursor is at column 6
    ahead.show("provisional")  # 4 cells on this row, 7 on the next: one row down
    ahead.clear()
    assert buf.getvalue() == "\x1b[2mprovisional\x1b[0m\r\x1b[1A\x1b[7G\x1b[J"
    ahead.show("")  # nothing ahead: nothing drawn, nothing to take back
    ahead.clear()
    assert buf.getvalue().endswith("\x1b[J")
    piped = _ProvisionalText(Console(file=io.StringIO(), force_terminal=False))
    piped.show("never on a pipe")
    assert piped.out.file.getvalue() == ""


# -- the emulator's outages -------------------------------------------------------------


@pytest.fixture()
def echo():
    import socket

    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")],
                             daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()
    server.close()


def test_the_link_emulator_cuts_or_holds_the_link_during_an_outage(echo):
    import socket

    from benchmarks.rigs.linkemu import DelayProxy

    with DelayProxy(echo) as proxy:
        host, port = proxy.address.split(":")
        conn = socket.create_connection((host, int(port)), timeout=30)
        conn.sendall(b"ping")
        assert conn.recv(16) == b"ping"
        proxy.outage("silent")  # bytes are held, not lost (it returns once the link is down)
        conn.sendall(b"held")
        conn.settimeout(0.3)
        with pytest.raises(TimeoutError):  # nothing comes while the link is down
            conn.recv(16)
        proxy.restore()
        conn.settimeout(30)
        assert conn.recv(16) == b"held"
        proxy.outage("reset")  # the connection is cut, and new ones are refused
        with pytest.raises(ConnectionError):  # a reset, not a wait (a timeout would be an OSError, not this)
            conn.sendall(b"x")
            if not conn.recv(16):
                raise ConnectionResetError("closed")
        again = socket.create_connection((host, int(port)), timeout=30)
        with pytest.raises(ConnectionError):
            again.sendall(b"x")
            if not again.recv(16):
                raise ConnectionResetError("closed")
        proxy.restore()
        back = socket.create_connection((host, int(port)), timeout=30)
        back.sendall(b"back")
        assert back.recv(16) == b"back"
        with pytest.raises(ValueError):
            proxy.outage("flaky")


# -- what a review found ------------------------------------------------------------------


class _StopAtOnce:
    """A controller that never drafts: every block is empty."""

    name = "stop-at-once"

    def window(self, limit: int) -> int:
        return limit

    def draft_next(self, index, step):
        return False

    def observe(self, drafted: int, accepted: int) -> None:
        pass


def _session(kind: str = "silent", **config) -> tuple[EdgeClient, Outage]:
    outage = Outage(at=3, kind=kind)
    return _client(outage, noise=1.5, config=config, max_tokens=60, draft_k=4), outage


def test_a_controller_that_never_drafts_does_not_spin_through_an_outage():
    client, _ = _session(max_provisional=12)
    events = list(client.generate("through the outage", controller=_StopAtOnce()))
    provisional = [e for e in events if isinstance(e, Provisional)]
    assert len(provisional) <= 2 * 12 + 60  # bounded: each one drafted a token, up to the cap
    assert events[-1].token_ids == _reference()


def test_the_shared_draft_is_free_while_the_consumer_holds_a_provisional_event():
    client, _ = _session()
    session = client.session()
    session.open(client.tokenize("through the outage"))
    stream = session.stream()
    first = next(e for e in stream if isinstance(e, Provisional))
    assert first.token_ids
    assert session.drafter.shared.lock.acquire(timeout=1.0)  # another session of the client could draft now
    session.drafter.shared.lock.release()
    rest = list(stream)
    assert rest[-1].token_ids[-5:] == _reference()[-5:]


def test_a_turn_after_an_answer_stopped_mid_round_reopens_the_session_in_step():
    client, outage = _session()
    session = client.session()
    session.open(client.tokenize("through the outage"))
    stream = session.stream()
    next(e for e in stream if isinstance(e, Provisional))
    stream.close()  # the consumer stops while the verify call is silent: the verifier applies it later
    outage.restore()
    assert outage.answered.wait(HOLD_S)  # applied now
    session.extend(client.tokenize(" and more", special=False))  # StaleRound: reopened from its tokens
    server = client.transport.inner.service.sessions.get(session.session_id)
    assert server.tokens == session.tokens


def test_a_cut_that_leaves_only_the_guess_sends_no_empty_block():
    chain = DraftChain(base=0)
    chain.add(_block([1, 2, 3, 4, 5]))
    assert chain.front(4).tokens == [1, 2, 3, 4]
    chain.advance(4, 4, 5)  # token 5 was the guess: nothing of the block is left
    assert chain.tokens == [] and chain.ends == []


def test_new_upload_settings_void_what_was_drafted_ahead():
    client, _ = _session()
    session = client.session()
    session.open(client.tokenize("through the outage"))
    with session.drafter.held():
        session.drafter.chain.add(session.drafter.block(4))
    assert len(session.drafter.chain) and not session.drafter.chain.rows
    session.reconfigure(upload="fh")
    assert len(session.drafter.chain) == 0 and session.draft.n_past <= len(session.tokens)
