"""The verifier's scheduling and its engine loop. The scheduler alone, no engine: batches
across sessions in arrival order, chunked prefill (a chunk queued once the one before has
run), a full queue refused with a back-off hint, and work withdrawn at its call's deadline.
The engine core on the toy engine: works that wait together run together, a long prefill
lets other sessions' rounds through, deadlines that withdraw queued work, and a clean stop."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from _wait import until

from edgekit import LimitExceededError, ServerConfig, VerifierUnavailableError
from edgekit.protocol import BlockRequest, OpenRequest
from edgekit.testing import FakeDraftModel, InProcessTransport, ToyLanguageModel
from edgekit.verifier import EngineCore, FcfsScheduler, Feed, ToyEngine, VerifierService
from edgekit.verifier.scheduler import Work

TARGET = ToyLanguageModel(seed=5)
DRAFT = FakeDraftModel(ToyLanguageModel(seed=5))


class GatedEngine(ToyEngine):
    """A toy engine that holds each batch until the test lets it go, and records what ran together."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)
        self.ran: list[list[tuple[int, int, int]]] = []

    def run_batch(self, feeds):
        self.entered.release()
        self.gate.acquire()
        self.ran.append([(f.seq, f.start, len(f.tokens)) for f in feeds])
        return super().run_batch(feeds)


def _joined(*threads: threading.Thread) -> None:
    for t in threads:
        t.join(30)
        assert not t.is_alive(), f"{t.name} did not finish within 30 s"


def _work(seq: int, start: int, n: int, n_out: int = 1) -> Work:
    return Work(Feed(seq, start, tuple(range(2, 2 + n)), n_out))


def test_fcfs_batches_in_arrival_order_within_its_row_budget_and_the_oldest_always_goes():
    s = FcfsScheduler(max_rows=8)
    for seq, n in ((0, 5), (1, 2), (2, 4), (3, 1)):
        s.submit(_work(seq, 0, n))
    assert [w.feed.seq for w in s.schedule().works] == [0, 1]  # 5 + 2 rows; the next 4 would pass 8
    assert [w.feed.seq for w in s.schedule().works] == [2, 3]
    assert s.schedule() is None
    s.submit(_work(4, 0, 20))  # larger than the budget on its own: it still goes
    assert [w.feed.seq for w in s.schedule().works] == [4]
    one = FcfsScheduler(max_works=1)  # one session at a time
    for seq in range(3):
        one.submit(_work(seq, 0, 1))
    assert [len(one.schedule().works) for _ in range(3)] == [1, 1, 1]


@pytest.mark.parametrize("policy", ["fcfs", "wisp"])
def test_every_policy_cuts_batches_at_the_configs_row_cap(policy):
    from edgekit.verifier import VerifyTimeEstimator
    from edgekit.verifier.scheduler import SCHEDULERS

    config = ServerConfig(max_batch_rows=12, policy=policy)
    s = SCHEDULERS.load(policy)(VerifyTimeEstimator(), config)
    for seq in range(5):
        s.submit(_work(seq, 0, 5))  # 25 rows wait: 10 fit under 12, the third round would pass it
    sizes = []
    while (batch := s.schedule()) is not None:
        sizes.append(sum(w.rows for w in batch.works))
    assert sizes == [10, 10, 5]
    with pytest.raises(Exception, match="max_batch_rows"):
        ServerConfig(max_batch_rows=0)


def test_a_cancelled_work_is_never_scheduled():
    s = FcfsScheduler()
    gone, kept = _work(0, 0, 1), _work(1, 0, 1)
    s.submit(gone)
    s.submit(kept)
    assert gone.future.cancel()
    assert [w.feed.seq for w in s.schedule().works] == [1] and s.waiting() == 0


def _ran(s: FcfsScheduler, run_ms: float = 1.0):
    """Schedules the next batch and tells the scheduler it ran (logits of a 4-token vocabulary);
    the batch's works as (seq, start, rows)."""
    batch = s.schedule()
    s.update(batch, [np.zeros((f.n_out, 4), np.float32) for f in batch.feeds], run_ms)
    return [(w.feed.seq, w.feed.start, w.rows) for w in batch.works]


def test_a_long_prefill_runs_in_chunks_each_queued_once_the_one_before_has_run():
    s = FcfsScheduler(prefill_chunk=4)
    prefill = _work(0, 3, 10, n_out=0)  # a turn of 10 tokens from position 3: chunks of 4, 4 and 2
    s.submit(prefill)
    assert s.waiting() == 1  # one chunk at a time
    batch = s.schedule()
    s.submit(_work(1, 0, 2))  # a round arrives while the first chunk runs ...
    s.update(batch, [np.zeros((0, 4), np.float32)], 3.0)
    assert _ran(s, 2.0) == [(1, 0, 2), (0, 7, 4)]  # ... and goes before the second
    assert not prefill.future.done()
    assert _ran(s, 1.0) == [(0, 11, 2)]
    done = prefill.future.result(timeout=0)
    assert done.logits.shape == (0, 4) and done.run_ms == 6.0 and done.batch_size == 1
    assert s.schedule() is None
    # A round (it wants logits), or a prefill that fits in one chunk, goes whole.
    s.submit(_work(2, 0, 9))
    s.submit(_work(3, 0, 4, n_out=0))
    assert _ran(s) == [(2, 0, 9), (3, 0, 4)]
    assert FcfsScheduler().submit(_work(4, 0, 1000, n_out=0)) is not None  # no chunk size: never cut
    # A chunk that fails fails its prefill, and nothing more of it runs.
    prefill = _work(5, 0, 8, n_out=0)
    s.submit(prefill)
    s.update(s.schedule(), RuntimeError("engine"), 1.0)
    with pytest.raises(RuntimeError, match="engine"):
        prefill.future.result(timeout=0)
    assert s.waiting() == 0


def test_a_full_queue_refuses_new_work_with_a_back_off_at_the_engines_recent_pace():
    s = FcfsScheduler(max_queue=2, prefill_chunk=4)
    s.submit(_work(0, 0, 50))
    s.submit(_work(1, 0, 50))
    with pytest.raises(LimitExceededError, match=r"queue is full \(2 works waiting\)") as err:
        s.submit(_work(2, 0, 5))
    assert err.value.retry_after == 0.05  # no batch has run yet: the shortest back-off
    assert _ran(s, run_ms=10_000.0) == [(0, 0, 50), (1, 0, 50)]  # 100 ms a row: the pace moves 1/5 of the way
    s.submit(_work(3, 0, 5))
    s.submit(_work(4, 0, 5))

    def hint(work: Work) -> float:
        with pytest.raises(LimitExceededError) as err:
            s.submit(work)
        return err.value.retry_after

    assert hint(_work(5, 0, 5)) == pytest.approx(2 * 5 * 20.0 / 1e3)  # what waits, at 20 ms a row
    assert hint(_work(6, 0, 100, n_out=0)) == pytest.approx(2 * 4 * 20.0 / 1e3)  # a long prefill: its first chunk
    s.update(s.schedule(), RuntimeError("engine"), 1e6)  # a batch that failed says nothing of the pace
    s.submit(_work(7, 0, 5))
    s.submit(_work(8, 0, 5))
    assert hint(_work(9, 0, 5)) == pytest.approx(2 * 5 * 20.0 / 1e3)


def test_an_admitted_prefills_later_chunks_are_not_refused():
    s = FcfsScheduler(max_queue=1, prefill_chunk=4)
    prefill = _work(0, 0, 8, n_out=0)
    s.submit(prefill)
    batch = s.schedule()
    s.submit(_work(1, 0, 1))  # the queue is full again while the first chunk runs
    s.update(batch, [np.zeros((0, 4), np.float32)], 1.0)
    assert s.waiting() == 2  # the second chunk queued all the same
    assert _ran(s) == [(1, 0, 1), (0, 4, 4)] and prefill.future.done()


def test_work_withdrawn_at_its_deadline_runs_no_further():
    s = FcfsScheduler(prefill_chunk=4)
    queued, running = _work(0, 0, 2), _work(1, 0, 2)
    s.submit(running)
    batch = s.schedule()
    s.submit(queued)
    assert s.withdraw(queued) and queued.future.cancelled()  # queued: it never runs
    assert not s.withdraw(running)  # running: it completes, and its caller gets its result
    s.update(batch, [np.zeros((1, 4), np.float32)], 1.0)
    assert running.future.result(timeout=0).logits.shape == (1, 4) and s.schedule() is None
    # A prefill in chunks: withdrawn while a chunk waits, none of the rest runs ...
    prefill = _work(2, 0, 12, n_out=0)
    s.submit(prefill)
    _ran(s)
    assert s.withdraw(prefill) and prefill.future.cancelled() and s.schedule() is None
    # ... while one runs, that one completes and none after it runs ...
    prefill = _work(3, 0, 12, n_out=0)
    s.submit(prefill)
    batch = s.schedule()
    assert not s.withdraw(prefill)
    s.update(batch, [np.zeros((0, 4), np.float32)], 1.0)
    assert prefill.future.cancelled() and s.schedule() is None
    # ... and while its last one runs, it completes.
    prefill = _work(4, 0, 8, n_out=0)
    s.submit(prefill)
    _ran(s)
    batch = s.schedule()
    assert not s.withdraw(prefill)
    s.update(batch, [np.zeros((0, 4), np.float32)], 1.0)
    assert prefill.future.result(timeout=0).run_ms == 2.0


def test_works_that_wait_together_run_in_one_batch_and_each_gets_its_own_rows():
    engine = GatedEngine(TARGET, n_seq=4, max_context=64)
    core = EngineCore(engine, FcfsScheduler())
    results: dict[int, np.ndarray] = {}
    prompts = {seq: [seq + 2] * (seq + 3) for seq in range(3)}

    def run(seq: int) -> None:
        results[seq] = core.run(Feed(seq, 0, tuple(prompts[seq]), 2)).logits

    first = threading.Thread(target=run, args=(0,))
    first.start()
    engine.entered.acquire()  # the first batch runs (held) ...
    others = [threading.Thread(target=run, args=(seq,)) for seq in (1, 2)]
    for t in others:
        t.start()
    until(lambda: core.scheduler.waiting() >= 2, "the other two works queued")  # ... while the other two queue
    engine.gate.release()
    assert engine.entered.acquire(timeout=30)
    engine.gate.release()
    _joined(first, *others)
    assert [len(b) for b in engine.ran] == [1, 2]  # the two that waited together ran together
    assert core.batch_sizes == {1: 1, 2: 1}
    for seq, prompt in prompts.items():
        expected = [TARGET.logits(prompt[: len(prompt) - 2 + i + 1]) for i in range(2)]
        assert np.array_equal(results[seq], np.stack(expected))
    core.close()


def test_a_long_prefill_lets_another_sessions_round_through_between_its_chunks():
    engine = GatedEngine(TARGET, n_seq=2, max_context=256)
    config = ServerConfig(port=0, max_sessions=2, max_context=256, max_block=8, prefill_chunk=16)
    v = InProcessTransport(VerifierService(engine, config))
    opened = {}

    def open_session(name: str, text: str) -> None:
        opened[name] = v.open_session(OpenRequest(DRAFT.tokenize(text), mode="greedy", seed=0,
                                      draft=DRAFT.fingerprint()))

    first = threading.Thread(target=open_session, args=("short", "hi"))
    first.start()
    assert engine.entered.acquire(timeout=30)
    engine.gate.release()
    _joined(first)
    short = opened["short"]
    long = threading.Thread(target=open_session, args=("long", "x" * 60))  # a 60-token prefill: 4 chunks of 16
    long.start()
    assert engine.entered.acquire(timeout=30)  # its first chunk runs (held) while the short session sends a round
    block = BlockRequest(session_id=short.session_id, base_position=short.committed_length, draft_tokens=[5, 6])
    rounder = threading.Thread(target=v.verify, args=(block,))
    rounder.start()
    until(lambda: v.service.core.scheduler.waiting() >= 1, "the round queued")
    engine.gate.release()
    deadline = time.monotonic() + 30
    while long.is_alive() or rounder.is_alive():  # let every later batch through
        assert time.monotonic() < deadline, "the prefill and the round did not finish within 30 s"
        if engine.entered.acquire(timeout=0.05):
            engine.gate.release()
    short_seq = v.service.sessions.get(short.session_id).seq
    long_seq = v.service.sessions.get(opened["long"].session_id).seq
    chunks = [(i, start, n) for i, b in enumerate(engine.ran[1:]) for seq, start, n in b if seq == long_seq]
    assert [(start, n) for _, start, n in chunks] == [(0, 16), (16, 16), (32, 16), (48, 12)]
    (round_batch,) = [i for i, b in enumerate(engine.ran[1:]) if (short_seq, 2, 3) in b]
    # queued while the first chunk ran, it runs next (with the second chunk, or just before it): not after the last
    assert 1 <= round_batch <= chunks[1][0] < chunks[-1][0], engine.ran


def test_work_still_queued_at_its_deadline_is_withdrawn_and_never_runs():
    engine = GatedEngine(TARGET, n_seq=2, max_context=64)
    core = EngineCore(engine, FcfsScheduler())
    holder = threading.Thread(target=lambda: core.run(Feed(0, 0, (2, 3, 4), 1)))
    holder.start()
    assert engine.entered.acquire(timeout=30)  # the engine is busy with the first work (held until released)
    with pytest.raises(LimitExceededError, match="before the call's deadline") as info:
        core.run(Feed(1, 0, (5, 6), 1), deadline=time.monotonic() + 0.05)
    assert info.value.code == "DEADLINE_EXCEEDED"
    engine.gate.release()
    _joined(holder)
    assert engine.ran == [[(0, 0, 3)]] and engine.cached(1) == 0  # the withdrawn work never ran
    core.close()


def test_closing_runs_what_is_queued_then_refuses_new_work():
    core = EngineCore(ToyEngine(TARGET, n_seq=1, max_context=64), FcfsScheduler(), idle_s=0.05)
    assert core.run(Feed(0, 0, (2, 3), 1)).logits.shape == (1, TARGET.vocab_size)
    until(lambda: core._thread is None, "the idle engine thread left")  # idle: the engine thread leaves ...
    assert core.run(Feed(0, 2, (4,), 1)).logits.shape == (1, TARGET.vocab_size)  # ... and comes back with work
    core.close()
    with pytest.raises(VerifierUnavailableError, match="shutting down"):
        core.run(Feed(0, 3, (5,), 1))


@pytest.mark.parametrize("settings, reduced", [
    ({}, True),  # plain greedy: each row's best id, reduced by the engine
    ({"logprobs": 2}, False),  # the committed tokens' logprobs want the rows
    ({"repetition_penalty": 1.3}, False),  # the sampler adjusts the rows before its argmax
])
def test_a_greedy_round_over_plain_logits_asks_the_engine_only_for_its_rows_best_ids(settings, reduced):
    from edgekit import ClientConfig
    from edgekit.testing import toy_client

    target = ToyLanguageModel(seed=5)
    speculative = ClientConfig(first_route="speculative")  # the rounds asserted on: not the machine's choice
    plain = toy_client(target, noise=1.0, config=speculative, max_tokens=40, draft_k=4, stop_at_eos=False, **settings)
    engine = plain.transport.service.engine
    feeds: list[Feed] = []
    run = engine.run_batch
    engine.run_batch = lambda batch: (feeds.extend(batch), run(batch))[1]
    got = plain.generate("hello").until_done()
    rounds = [f for f in feeds if f.n_out]
    assert rounds and all(bool(f.argmax) == reduced for f in rounds)
    assert all(f.argmax == target.vocab_size - target.padding for f in rounds if f.argmax)  # the target's own ids
    alone = toy_client(target, max_tokens=40, stop_at_eos=False, **settings).generate_target_only("hello").until_done()
    assert got.token_ids == alone.token_ids and got.stats.drafted > 0
