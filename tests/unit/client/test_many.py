"""Several generations on one client (issue 18, item 2): each in a draft slot of its own,
drafting while the others' blocks are verified, their steps batched. Every task's output is
what it is alone (the target's own greedy output); a task that fails fails alone and gives
its slot back; with more tasks than slots the rest share the first slot."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from _wait import until

from edgekit import AsyncEdgeClient, EdgeClient, GenerationConfig
from edgekit.errors import EdgekitError
from edgekit.runtime import DraftPool
from edgekit.testing import FakeDraftModel, ToyLanguageModel, ToyPoolBackend, toy_client, toy_verifier

TARGET = ToyLanguageModel(seed=21, eos_bias=-8.0)
DRAFT_LM = ToyLanguageModel(seed=21, noise=1.0)  # a draft that mostly agrees with the target
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12], [13, 14, 15]]


class _HeldBackend(ToyPoolBackend):
    """Holds its first decode until `ready(pool, steps)`: what the test needs to happen while a
    decode runs happens then, however the machine schedules the tasks' threads."""

    def __init__(self, *args, ready: Callable[[DraftPool, list], bool], what: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pool: DraftPool | None = None
        self.ready, self.what, self.held = ready, what, False

    def run(self, steps):
        if not self.held:
            self.held = True
            until(lambda: self.ready(self.pool, steps), self.what)
        return super().run(steps)


def _batching(pool: DraftPool, steps: list) -> bool:
    """Steps of different tasks run together: in this decode, or in the next (two wait for it)."""
    return len(steps) >= 2 or sum(ask.step is not None for ask in list(pool._queue)) >= 2


def _pool(slots: int, delay_s: float = 0.002, *, batched: bool = False,
          ready: Callable[[DraftPool, list], bool] | None = None, what: str = "") -> DraftPool:
    """A pool on the toy backend. `batched`: its first decode is held until some decode takes steps
    of different tasks together (`_batching`)."""
    if batched:
        ready, what = _batching, "two tasks asked for a draft step together"
    if ready is None:
        return DraftPool(ToyPoolBackend(DRAFT_LM, slots=slots, delay_s=delay_s))
    backend = _HeldBackend(DRAFT_LM, slots=slots, delay_s=delay_s, ready=ready, what=what)
    backend.pool = DraftPool(backend)
    return backend.pool


def _client(draft: DraftPool | ToyLanguageModel, **config) -> EdgeClient:
    """A client of a toy verifier of 16 sessions (`config`: its other settings) drafting with `draft`
    (every answer: these are tests of the drafting, never of the route an "auto" answer takes)."""
    return toy_client(TARGET, draft=draft, verifier=toy_verifier(TARGET, max_sessions=16, **config), max_tokens=24,
                      draft_k=4, stream_when_faster=False)


def test_every_task_of_a_pipelined_batch_writes_what_it_writes_alone():
    with _client(DRAFT_LM) as alone:
        expected = [alone.generate(p).until_done().token_ids for p in PROMPTS]
    assert all(list(e) == TARGET.greedy(p, 24) for e, p in zip(expected, PROMPTS))
    pool = _pool(4, batched=True)
    with _client(pool) as client:
        results = client.generate_many(PROMPTS)
        assert [r.token_ids for r in results] == expected
        assert pool.free_slots() == 3  # every task gave its slot back; the client holds the first
        assert pool.decodes < pool.steps  # steps of different tasks ran together


def test_threads_on_one_client_each_get_a_slot_and_more_threads_than_slots_share_the_first():
    pool = _pool(2)
    out: dict[int, tuple[int, ...]] = {}
    with _client(pool) as client:
        def run(i: int) -> None:
            out[i] = client.generate(PROMPTS[i]).until_done().token_ids

        threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {i: list(v) for i, v in out.items()} == {i: TARGET.greedy(PROMPTS[i], 24) for i in range(5)}
        assert pool.free_slots() == 1


def test_a_task_that_fails_fails_alone_and_gives_its_slot_back():
    pool = _pool(3)
    with _client(pool, max_context=64) as client:
        prompts = [PROMPTS[0], list(range(1, 80)), PROMPTS[1]]  # the second is past the verifier's context
        results = client.generate_many(prompts, return_exceptions=True)
        assert isinstance(results[1], EdgekitError)
        assert [list(results[i].token_ids) for i in (0, 2)] == [TARGET.greedy(prompts[i], 24) for i in (0, 2)]
        assert pool.free_slots() == 2
        with pytest.raises(EdgekitError):
            client.generate_many(prompts)  # without return_exceptions the failure is raised, after the others


def test_the_async_client_runs_a_pipelined_batch_without_blocking_its_event_loop():
    ticks = 0

    async def main():
        # The first decode is held until the event loop has ticked six times meanwhile (and two more
        # tasks wait to draft): a loop blocked by the batch could not, and the test would fail.
        pool = _pool(4, delay_s=0.004, ready=lambda pool, steps: ticks > 5 and _batching(pool, steps),
                     what="the event loop ticked six times while a decode ran")

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        async with AsyncEdgeClient(toy_verifier(TARGET, max_sessions=16), draft=pool,
                                   generation=GenerationConfig(max_tokens=24, draft_k=4,
                                                               stream_when_faster=False)) as client:
            ticker = asyncio.create_task(tick())  # counts only while the batch runs
            results = await client.generate_many(PROMPTS[:4])
            ticker.cancel()
        return results, ticks, pool

    results, ticks, pool = asyncio.run(main())
    assert [list(r.token_ids) for r in results] == [TARGET.greedy(p, 24) for p in PROMPTS[:4]]
    assert ticks > 5  # the loop kept running while the tasks drafted
    assert pool.decodes < pool.steps


def test_draft_slots_need_a_model_file_or_a_pool():
    with pytest.raises(ValueError, match="draft_slots"):
        EdgeClient(toy_verifier(TARGET), draft=FakeDraftModel(DRAFT_LM), draft_slots=2)


def test_a_stream_dropped_unread_or_a_prompt_that_fails_to_tokenize_gives_its_slot_back():
    import gc

    pool = _pool(3)
    with _client(pool) as client:
        stream = client.generate(PROMPTS[0])
        assert pool.free_slots() == 1
        del stream
        gc.collect()
        assert pool.free_slots() == 2
        with pytest.raises(TypeError):
            client.generate(12345)  # type: ignore[arg-type]
        assert pool.free_slots() == 2
