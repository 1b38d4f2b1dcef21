"""WISP's Algorithm 1 (`WispScheduler`) on a virtual clock: which works a dispatch
epoch takes and in what order. The estimator's coefficients are fixed: a work of
n rows alone takes n + 5 ms (1 ms per row, 5 ms per batch); the guard time is 5 ms
unless a test says otherwise, so a work is critical from 15 ms to 10 ms before its
deadline (its latest start, eq. 17) and late after."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.verifier import Coefficients, Feed, Objective, VerifyTimeEstimator, WispScheduler, Work

COST = Coefficients(a=1.0, c=5.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _scheduler(clock: Clock, **kw) -> WispScheduler:
    # Algorithm 1 as published (min_efficiency 0) unless a test says otherwise.
    return WispScheduler(VerifyTimeEstimator(COST), clock=clock, **({"guard_ms": 5.0, "min_efficiency": 0.0} | kw))


def _work(name: str, clock: Clock, rows: int = 5, *, due_ms: float | None = None, value: float = 3.0,
          waited_ms: float = 0.0) -> Work:
    """A work of `rows` rows, due `due_ms` from now (None: best effort), that arrived `waited_ms` ago."""
    deadline = None if due_ms is None else clock.now + due_ms / 1e3
    arrived = clock.now - waited_ms / 1e3
    return Work(Feed(0, 0, tuple(range(rows)), rows), session_id=name,
                objective=Objective(deadline, due_ms, value, arrived), submitted=arrived)


def _names(batch) -> list[str]:
    return [w.session_id for w in batch.works]


def test_best_effort_works_fill_the_batch_by_utility():
    clock = Clock()
    s = _scheduler(clock, max_rows=10)  # room for two works of five rows
    for name, value in (("low", 1.0), ("high", 4.0), ("mid", 2.0)):
        s.submit(_work(name, clock, value=value))
    batch = s.schedule()
    assert _names(batch) == ["high", "mid"]  # U = value / 10 ms, highest first (eq. 16)
    assert batch.estimated_ms == pytest.approx(10 + 5)  # both works' rows and one batch constant
    assert _names(s.schedule()) == ["low"] and s.schedule() is None


def test_utility_weighs_expected_tokens_against_the_works_cost():
    clock = Clock()
    s = _scheduler(clock, max_rows=30)
    s.submit(_work("long", clock, rows=25, value=4.0))  # 4 tokens / 30 ms
    s.submit(_work("short", clock, rows=5, value=2.0))  # 2 tokens / 10 ms: denser
    s.submit(_work("medium", clock, rows=20, value=3.5))  # 3.5 tokens / 25 ms
    assert _names(s.schedule()) == ["short", "medium"]  # "long" would pass the row budget: the batch stops


def test_critical_works_go_first_in_deadline_order():
    clock = Clock()
    s = _scheduler(clock, max_rows=10)
    s.submit(_work("rich", clock, value=100.0))  # best effort, very high utility
    s.submit(_work("later", clock, due_ms=16.0))  # latest start 16 - 10 - 5 = 1 ms away: not critical
    s.submit(_work("sooner", clock, due_ms=14.0))  # latest start 1 ms ago: critical
    s.submit(_work("soonest", clock, due_ms=12.0))  # critical, earlier deadline
    # EDF among the critical; with both the batch would take 15 ms, past "soonest"'s deadline: it stops.
    assert _names(s.schedule()) == ["soonest"]
    # Still critical at the next epoch, "sooner" goes before "rich", which would make it late.
    assert _names(s.schedule()) == ["sooner"]
    assert _names(s.schedule()) == ["rich", "later"]


def test_a_work_joins_only_if_every_member_still_meets_its_deadline_and_the_guard_protects_the_tight():
    def submit(s: WispScheduler, clock: Clock) -> None:
        s.submit(_work("tight", clock, rows=5, due_ms=20.0))  # 10 ms alone: latest start 10 ms away
        s.submit(_work("big", clock, rows=30, value=30.0))  # best effort, the densest: 35 ms alone
        s.submit(_work("small", clock, rows=2, value=1.0))

    clock = Clock()
    greedy = _scheduler(clock)  # latest start 5 ms away: nothing is critical yet; by utility: big, tight, small
    submit(greedy, clock)
    # "big" goes; "tight" would make the batch 40 ms, past its 20 ms deadline: the batch stops there.
    assert _names(greedy.schedule()) == ["big"]
    guarded = _scheduler(clock, guard_ms=15.0)  # latest start now: "tight" is critical
    submit(guarded, clock)
    batch = guarded.schedule()
    assert _names(batch) == ["tight"]  # "big" would break its deadline, which stops the batch
    assert clock.now + batch.estimated_ms / 1e3 <= batch.works[0].objective.deadline
    assert _names(guarded.schedule()) == ["big", "small"]


def test_the_guard_time_makes_a_work_critical_earlier():
    clock = Clock()
    works = lambda: [_work("rich", clock, value=50.0), _work("due", clock, due_ms=25.0)]  # noqa: E731
    plain = _scheduler(clock, max_rows=5)  # one work per batch
    for w in works():
        plain.submit(w)
    assert _names(plain.schedule()) == ["rich"]  # LST = 25 - 10 - 5 = 10 ms away: not critical
    guarded = _scheduler(clock, max_rows=5, guard_ms=20.0)
    for w in works():
        guarded.submit(w)
    assert _names(guarded.schedule()) == ["due"]  # LST = 25 - 10 - 20 < now: critical (eq. 17)


def test_a_late_work_is_not_dropped_and_is_served_as_soon_as_it_can_be():
    clock = Clock()
    s = _scheduler(clock)
    s.submit(_work("best", clock, value=1.0))  # U = 0.1
    s.submit(_work("due30", clock, due_ms=30.0))  # latest start 15 ms away; U = 0.3
    s.submit(_work("late", clock, due_ms=2.0))  # 10 ms alone: its deadline cannot be met any more
    # The late work first (before the non-critical), due now as soon as it can be: its 10 ms alone
    # plus the 5 ms guard. "due30" fits (15 ms); "best" would make the batch 20 ms.
    batch = s.schedule()
    assert _names(batch) == ["late", "due30"] and batch.estimated_ms == pytest.approx(15.0)
    assert _names(s.schedule()) == ["best"]


def test_late_works_do_not_let_a_batch_grow_to_the_whole_queue():
    clock = Clock()
    s = _scheduler(clock)
    for i in range(3):
        s.submit(_work(f"late{i}", clock, due_ms=1.0 + i))  # all late, most overdue first
    for i in range(3):
        s.submit(_work(f"free{i}", clock))
    # Exempt from deadlines, the batch would take all six (35 ms); as soon as possible, the first
    # late work holds it to 15 ms: one more five-row work.
    assert _names(s.schedule()) == ["late0", "late1"]
    assert _names(s.schedule()) == ["late2", "free0"]


def test_best_effort_work_waits_at_most_the_starvation_bound():
    clock = Clock()
    s = _scheduler(clock, max_rows=10, starvation_s=0.5)
    s.submit(_work("prefill", clock, rows=8, value=0.0))  # worth no tokens: lowest utility
    waited = None
    for epoch in range(200):  # every 10 ms two dense works arrive and fill the batch
        s.submit(_work(f"a{epoch}", clock, value=5.0))
        s.submit(_work(f"b{epoch}", clock, value=5.0))
        batch = s.schedule()
        if "prefill" in _names(batch):
            waited = epoch * 0.010
            break
        clock.now += 0.010
    assert waited is not None and 0.5 <= waited <= 0.52


def test_a_batch_is_never_empty_while_work_waits():
    clock = Clock()
    s = _scheduler(clock, max_rows=4)
    s.submit(_work("too big", clock, rows=9, due_ms=1.0))  # over the row budget and already late
    assert _names(s.schedule()) == ["too big"]


def test_works_whose_caller_gave_up_are_dropped():
    clock = Clock()
    s = _scheduler(clock)
    gone = _work("gone", clock)
    s.submit(gone)
    s.submit(_work("here", clock))
    gone.future.cancel()
    assert _names(s.schedule()) == ["here"] and s.waiting() == 0


def test_a_long_prefill_goes_in_chunks_under_wisp_too():
    clock = Clock()
    s = _scheduler(clock, prefill_chunk=4)
    prefill = Work(Feed(0, 0, tuple(range(6)), 0), session_id="prefill", submitted=clock.now)
    s.submit(prefill)
    batch = s.schedule()
    assert [(w.feed.start, w.rows) for w in batch.works] == [(0, 4)]
    s.update(batch, [np.zeros((0, 8), np.float32)], 4.0)
    batch = s.schedule()
    assert [(w.feed.start, w.rows) for w in batch.works] == [(4, 2)]
    s.update(batch, [np.zeros((0, 8), np.float32)], 2.0)
    assert prefill.future.result(timeout=0).run_ms == 6.0


def test_a_minimum_efficiency_lets_a_batch_outgrow_a_tight_deadline_while_its_constant_dominates():
    def batch_with(min_efficiency: float) -> list[str]:
        clock = Clock()
        s = _scheduler(clock, min_efficiency=min_efficiency)
        s.submit(_work("tight", clock, rows=1, due_ms=8.0))  # 6 ms alone: critical (guard 5 ms)
        for i in range(6):
            s.submit(_work(f"w{i}", clock, rows=1))
        return _names(s.schedule())

    # As published: three one-row works take 8 ms, all the tight deadline allows.
    assert batch_with(0.0) == ["tight", "w0", "w1"]
    # At least half work (n rows / (n + 5 ms)): a fourth row still leaves the constant the larger
    # share, so it joins (9 ms, past the deadline); a fifth would make the batch efficient and late.
    assert batch_with(0.5) == ["tight", "w0", "w1", "w2"]


def test_every_policy_the_config_takes_has_a_scheduler_by_name():
    from edgekit import ConfigError, ServerConfig
    from edgekit.verifier import VerifyTimeEstimator
    from edgekit.verifier.scheduler import SCHEDULERS

    assert {"fcfs", "wisp"} <= set(SCHEDULERS.names())
    for name in SCHEDULERS.names():
        config = ServerConfig(policy=name, prefill_chunk=32, max_queue=7)
        scheduler = SCHEDULERS.load(name)(VerifyTimeEstimator(), config)
        assert scheduler.name == name
        assert (scheduler.prefill_chunk, scheduler.max_queue) == (32, 7)  # the config's bounds
    with pytest.raises(ConfigError, match="policy must be one of fcfs, wisp"):
        ServerConfig(policy="lifo")  # type: ignore[arg-type]


def _rounds(s: WispScheduler, clock: Clock, session: str, n: int, *, due_ms: float) -> None:
    """`n` rounds of `session`, each due `due_ms` after it arrives, each dispatched alone at once."""
    for _ in range(n):
        s.submit(_work(session, clock, due_ms=due_ms))
        assert _names(s.schedule()) == [session]
        clock.now += 0.050


def _contended(s: WispScheduler, clock: Clock) -> list[str]:
    """A late round of "far" (due in 2 ms; 10 ms alone) beside two reachable ones due in 30 ms."""
    s.submit(_work("far", clock, due_ms=2.0))
    s.submit(_work("near0", clock, due_ms=30.0))
    s.submit(_work("near1", clock, due_ms=30.0))
    return _names(s.schedule())


def test_a_session_whose_rounds_keep_going_late_goes_after_the_reachable_ones():
    clock = Clock()
    s = _scheduler(clock, max_rows=15)
    # Ten late rounds: 1 - 0.8^10 = 0.89 of them late, not more than 0.9: still late-first, as soon as
    # it can be (10 ms alone + 5 ms guard), so one reachable round joins it and the other waits.
    _rounds(s, clock, "far", 10, due_ms=2.0)
    assert not s.out_of_reach("far")
    assert _contended(s, clock) == ["far", "near0"]
    assert _names(s.schedule()) == ["near1"]
    # That was its eleventh late round (0.91): out of reach. Its work now goes behind both reachable
    # rounds, which fit in 15 ms; its deadline stops nothing, so it joins them (20 ms, within 30).
    assert s.out_of_reach("far")
    clock.now += 0.050
    assert _contended(s, clock) == ["near0", "near1", "far"]


def test_an_out_of_reach_session_takes_its_place_back_when_its_rounds_go_in_time():
    clock = Clock()
    s = _scheduler(clock)
    _rounds(s, clock, "far", 12, due_ms=2.0)
    assert s.out_of_reach("far")  # 0.93
    _rounds(s, clock, "far", 1, due_ms=30.0)  # dispatched in time: 0.93 * 0.8 = 0.74 of its rounds late
    assert not s.out_of_reach("far")


def test_prefills_and_best_effort_work_do_not_count_toward_being_out_of_reach():
    clock = Clock()
    s = _scheduler(clock)
    for _ in range(20):  # a prefill due in 1 ms, late, and best-effort rounds: nothing counts
        s.submit(Work(Feed(0, 0, tuple(range(20)), 0), session_id="p",
                      objective=Objective(clock.now + 0.001, 1.0, 1.0, clock.now), submitted=clock.now))
        s.submit(_work("b", clock))
        s.schedule(), s.schedule()
    assert not s.out_of_reach("p") and not s.out_of_reach("b")


def test_unreachable_share_one_keeps_late_work_first():
    clock = Clock()
    s = _scheduler(clock, max_rows=15, unreachable_share=1.0)
    _rounds(s, clock, "far", 50, due_ms=2.0)
    assert not s.out_of_reach("far")
    assert _contended(s, clock) == ["far", "near0"]
    with pytest.raises(ValueError):
        _scheduler(clock, unreachable_share=0.0)
