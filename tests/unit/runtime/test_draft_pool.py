"""The draft pool (issue 18, item 1): one draft model, a KV sequence per task, the steps of
tasks drafting at the same time run as one decode. Over a toy backend: slots are
independent, concurrent steps are batched and each task gets what it would alone, long
prefills are chunked, a failing step fails alone, slots are given back. Over the gemma
draft: a slot drafts what the plain draft model drafts."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgekit.errors import EdgekitError, LimitExceededError
from edgekit.runtime import DraftPool, Step
from edgekit.testing import FakeDraftModel, ToyLanguageModel, ToyPoolBackend

LM = ToyLanguageModel(seed=5)


def _alone(prompt: list[int], steps: int) -> list[int]:
    """Greedy drafting of `steps` tokens on a draft model of its own."""
    draft = FakeDraftModel(LM)
    out, feed = [], prompt
    for _ in range(steps):
        tok = int(np.argmax(draft.eval(feed).logits))
        out.append(tok)
        feed = [tok]
    return out


def _drafting(slot, prompt: list[int], steps: int, into: list) -> None:
    feed = prompt
    for _ in range(steps):
        tok = int(np.argmax(slot.eval(feed).logits))
        into.append(tok)
        feed = [tok]


def test_slots_keep_sequences_of_their_own():
    pool = DraftPool(ToyPoolBackend(LM, slots=2))
    a, b = pool.acquire(), pool.acquire()
    assert a is not None and b is not None and pool.acquire() is None  # two slots, both taken
    got_a, got_b = [], []
    _drafting(a, [1, 2, 3], 6, got_a)
    _drafting(b, [7, 8], 6, got_b)
    assert got_a == _alone([1, 2, 3], 6) and got_b == _alone([7, 8], 6)
    a.truncate(3)  # a rolls back; b is untouched
    assert a.n_past == 3 and pool.backend.sequences[b.seq] == [7, 8, *got_b[:-1]]
    assert a.eval([got_a[0]]).logits.tolist() == LM.logits([1, 2, 3, got_a[0]]).tolist()


def test_steps_asked_for_together_run_as_one_decode_and_each_task_gets_its_own():
    backend = ToyPoolBackend(LM, slots=4, delay_s=0.005)
    pool = DraftPool(backend)
    prompts = [[1, 2], [3, 4, 5], [6], [9, 9, 9, 9]]
    slots = [pool.acquire() for _ in prompts]
    results: list[list[int]] = [[] for _ in prompts]
    threads = [threading.Thread(target=_drafting, args=(s, p, 12, r)) for s, p, r in zip(slots, prompts, results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [_alone(p, 12) for p in prompts]
    assert pool.steps == 4 * 12
    # batched, not one at a time (the threads may settle
    # into two pairs that alternate, each decode taking the pair that queued during the other's)
    assert pool.decodes < 4 * 12 * 0.75 and max(backend.batches) >= 2


def test_a_task_drafting_alone_is_never_held_back():
    backend = ToyPoolBackend(LM, slots=3)
    pool = DraftPool(backend)
    got: list[int] = []
    _drafting(pool.acquire(), [1, 2, 3], 10, got)
    assert backend.batches == [1] * 10


def test_a_prefill_longer_than_a_decode_runs_in_chunks():
    backend = ToyPoolBackend(LM, slots=1, max_rows=8)
    slot = DraftPool(backend).acquire()
    prompt = list(range(2, 22))
    out = slot.eval(prompt)
    assert slot.n_past == 20 and backend.sequences[0] == prompt
    assert out.logits.tolist() == LM.logits(prompt).tolist()


def test_a_step_that_fails_fails_alone_and_a_released_slot_is_emptied_and_given_again():
    backend = ToyPoolBackend(LM, slots=2, n_ctx_seq=16)
    pool = DraftPool(backend)
    a, b = pool.acquire(), pool.acquire()
    with pytest.raises(LimitExceededError):
        a.eval(list(range(2, 30)))  # past its slot's context
    assert b.eval([1, 2]).logits.shape == (LM.vocab_size,)
    a.close()
    with pytest.raises(EdgekitError, match="given back"):
        a.eval([1])
    again = pool.acquire()
    assert again is not None and again.seq == a.seq and backend.sequences[a.seq] == [] and again.n_past == 0


def test_a_backend_error_in_a_shared_decode_reaches_only_the_step_that_caused_it():
    class Picky(ToyPoolBackend):
        def run(self, steps):
            if any(s.tokens == [13] for s in steps):
                raise RuntimeError("token 13 is refused")
            return super().run(steps)

    pool = DraftPool(Picky(LM, slots=2, delay_s=0.01))
    a, b = pool.acquire(), pool.acquire()
    errors, fine = [], []

    def bad():
        try:
            a.eval([13])
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=bad)
    t.start()
    fine.append(b.eval([5]))
    t.join()
    assert len(errors) == 1 and fine[0].logits.tolist() == LM.logits([5]).tolist()


def test_steps_that_want_hidden_states_are_not_mixed_with_those_that_do_not():
    backend = ToyPoolBackend(LM, slots=2)
    pool = DraftPool(backend)
    a = pool.acquire()
    assert a.eval([1, 2, 3], hidden=True).hidden is not None  # the head prefilled, the last row with its state
    assert backend.sequences[a.seq] == [1, 2, 3]
    assert pool.step(Step(a.seq, 3, [4], output=False)) is None


def test_closing_the_pool_fails_the_steps_still_waiting_and_hangs_no_one():
    pool = DraftPool(ToyPoolBackend(LM, slots=3, delay_s=0.2))
    a, b = pool.acquire(), pool.acquire()
    results: dict[str, str] = {}

    def run(name, slot):
        try:
            slot.eval([1, 2, 3])
            results[name] = "ok"
        except EdgekitError as exc:
            results[name] = str(exc)

    first = threading.Thread(target=run, args=("a", a))
    first.start()
    while not pool._busy:  # a's decode is running
        pass
    second = threading.Thread(target=run, args=("b", b))
    second.start()
    while not pool._queue:  # b waits behind it
        pass
    pool.close()
    first.join(5)
    second.join(5)
    assert results == {"a": "ok", "b": "the draft pool is closed"}
    with pytest.raises(EdgekitError, match="closed"):
        pool.acquire()
    a.close()  # giving a slot back to a closed pool does nothing


def test_a_decode_that_fails_after_storing_its_rows_leaves_every_slot_consistent():
    class StoresThenFails(ToyPoolBackend):
        failed = False

        def run(self, steps):
            out = super().run(steps)
            if len(steps) > 1 and not self.failed:
                self.failed = True
                raise RuntimeError("reading the outputs failed")
            return out

    backend = StoresThenFails(LM, slots=3, delay_s=0.02)
    pool = DraftPool(backend)
    slots = [pool.acquire() for _ in range(3)]
    outs: dict[int, list[float]] = {}

    def go(i):
        outs[i] = slots[i].eval([1, 2]).logits.tolist()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert backend.failed and backend.sequences == [[1, 2]] * 3 and [s.n_past for s in slots] == [2, 2, 2]
    assert all(v == LM.logits([1, 2]).tolist() for v in outs.values())


def test_a_slot_given_back_cannot_touch_the_sequence_its_successor_holds():
    pool = DraftPool(ToyPoolBackend(LM, slots=1))
    a = pool.acquire()
    a.prefill([1, 2, 3])
    a.close()
    b = pool.acquire()
    b.prefill([7, 8, 9, 10])
    a.truncate(1)  # nothing: a holds nothing any more
    assert pool.backend.sequences[b.seq] == [7, 8, 9, 10] and a.n_past == 0
