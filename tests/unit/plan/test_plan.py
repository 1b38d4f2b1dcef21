"""The serving-latency model and the plan (issue 18, item 4; paper 003 sec. II-C to III-B): the
FLOPs of eqs. 11-14, the runtime fit of eq. 17, the pipeline recursion of eqs. 20-22, and the
dynamic program of Algorithm 1 with the window by enumeration, within 5% of exhaustive search
over every ordered partition on small cases, and respecting the memory bound."""

from __future__ import annotations

import random

import pytest

from edgekit.plan import ModelShape, Runtime, ServingModel, batches_for_window, exhaustive, plan

DRAFT = ModelShape(layers=2, hidden=64, ffn=256)
TARGET = ModelShape(layers=8, hidden=256, ffn=1024)


def _model(**kw) -> ServingModel:
    base = dict(draft=DRAFT, verify=TARGET, draft_runtime=Runtime(2e-10, 1e-3), verify_runtime=Runtime(5e-11, 4e-3),
                acceptance=0.7, max_output=32, link_s=0.01)
    return ServingModel(**(base | kw))  # type: ignore[arg-type]


def test_flops_are_the_papers():
    j, h, f = 2, 64, 256
    assert DRAFT.prefill_flops(10) == 4 * j * h * 10 * (2 * h + 10 + f)  # eq. 13, n = i = 1
    assert DRAFT.decode_flops(30) == 4 * j * h * (2 * h + 30 + 1 + f)  # eq. 13, else
    assert DRAFT.verify_flops(5, 30) == 4 * j * h * 5 * (2 * h + 30 + 5 + f)  # eq. 14 with 1 + l = 5
    assert DRAFT.param_bytes == j * (8 * h * h + 4 * h * f) and DRAFT.kv_bytes_per_token == 4 * j * h


def test_the_runtime_fit_recovers_eq_17s_coefficients():
    rng = random.Random(0)
    truth = Runtime(3e-11, 2e-3)
    samples = [(b, f, truth.seconds(b, f) * (1 + rng.gauss(0, 0.01))) for b in (1, 2, 4, 8) for f in (1e7, 5e7, 1e8)]
    fit = Runtime.fit(samples)
    assert fit.c1 == pytest.approx(truth.c1, rel=0.05) and fit.c2 == pytest.approx(truth.c2, rel=0.1)
    assert fit.error(samples) < 0.03
    assert Runtime.fit([(1, 1e6, 0.01)]).seconds(1, 1e6) == pytest.approx(0.01)


def test_a_fit_whose_line_would_go_negative_keeps_both_coefficients_at_zero_or_above():
    """What a loaded machine measures (a batch of 8 no slower than one) tilts the line: the fit is
    then the mean time (c1 = 0); a line through negative time at no work goes through the origin."""
    flat = Runtime.fit([(1, 1e7, 0.012), (2, 1e7, 0.011), (4, 1e7, 0.011), (8, 1e7, 0.010)])  # falling
    assert (flat.c1, flat.c2) == (0.0, pytest.approx(0.011))
    steep = Runtime.fit([(1, 1e7, 0.001), (2, 1e7, 0.004), (4, 1e7, 0.010)])  # intercept below 0
    assert steep.c2 == 0.0 and steep.c1 > 0
    assert steep.seconds(4, 1e7) == pytest.approx(0.010, rel=0.2)


def test_tokens_per_step_and_steps_are_eqs_7_and_8():
    m = _model(acceptance=0.5, max_output=100)
    assert m.tokens_per_step(3) == pytest.approx((1 - 0.5**4) / 0.5)
    assert m.steps(3) == 54  # ceil(100 / 1.875)


def test_one_batch_takes_the_sum_of_its_stages_and_two_batches_overlap():
    m = _model()
    d, v = m.stage_times(2, 20, 4)
    assert m.latency([[0, 1]], [20, 20], 4) == pytest.approx(float((d + v).sum()))
    one_by_one = sum(m.latency([[k]], [20, 20], 4) for k in (0, 1))
    pipelined = m.latency([[0], [1]], [20, 20], 4)
    assert pipelined < one_by_one  # the second batch drafts while the first is verified


@pytest.mark.parametrize("seed", range(25))
def test_the_plan_is_within_five_percent_of_exhaustive_search(seed):
    rng = random.Random(seed)
    m = _model(
        draft_runtime=Runtime(rng.uniform(1e-11, 1e-9), rng.uniform(1e-4, 5e-3)),
        verify_runtime=Runtime(rng.uniform(1e-12, 1e-10), rng.uniform(1e-3, 2e-2)),
        acceptance=rng.uniform(0.3, 0.9),
        max_output=rng.choice((16, 32, 64)),
        link_s=rng.uniform(0.0, 0.05),
    )
    inputs = [rng.randint(8, 400) for _ in range(rng.randint(1, 5))]
    ours, best = plan(m, inputs, 6), exhaustive(m, inputs, 6)
    assert ours.predicted_s <= best.predicted_s * 1.05
    assert sorted(k for b in ours.batches for k in b) == list(range(len(inputs)))


def test_batches_that_do_not_fit_in_memory_are_never_planned():
    m = _model()
    per_task = DRAFT.kv_bytes_per_token * (100 + m.max_output)
    tight = _model(memory_bytes=DRAFT.param_bytes + 2.5 * per_task)  # at most two tasks of 100 tokens at once
    p = batches_for_window(tight, [100] * 5, 3)
    assert p is not None and max(len(b) for b in p.batches) <= 2
    assert batches_for_window(_model(memory_bytes=DRAFT.param_bytes), [100], 3) is None
    with pytest.raises(ValueError, match="memory"):
        plan(_model(memory_bytes=DRAFT.param_bytes), [100], 3)


def test_a_phaser_lets_a_batch_go_when_all_arrive_or_the_rest_have_left():
    import threading

    from edgekit.plan import Phaser

    phaser = Phaser(3)
    passed: list[str] = []

    def arrive(name):
        phaser.arrive_and_wait(5)
        passed.append(name)

    threads = [threading.Thread(target=arrive, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    assert not passed  # two of three arrived
    phaser.leave()  # the third finished: the others go on
    for t in threads:
        t.join(5)
    assert sorted(passed) == ["a", "b"]
    phaser.leave()  # one of the two left: the last arrives alone and goes at once
    phaser.arrive_and_wait(5)


def test_generate_many_runs_a_plan_and_each_task_writes_its_own_output():
    from edgekit.errors import ConfigError
    from edgekit.plan import Plan
    from edgekit.runtime import DraftPool
    from edgekit.testing import ToyLanguageModel, ToyPoolBackend, toy_client, toy_verifier

    target = ToyLanguageModel(seed=3, eos_bias=-8.0)
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8, 9, 10]]
    pool = DraftPool(ToyPoolBackend(ToyLanguageModel(seed=3, noise=0.8), slots=5, delay_s=0.002))
    with toy_client(target, draft=pool, verifier=toy_verifier(target, max_sessions=8), max_tokens=20) as client:
        results = client.generate_many(prompts, plan=Plan(((2, 0), (1, 3)), 3, 0.0))
        assert [list(r.token_ids) for r in results] == [target.greedy(p, 20) for p in prompts]
        assert all(r.stats.drafting == "fixed-3" for r in results)
        with pytest.raises(ConfigError, match="covers"):
            client.generate_many(prompts, plan=Plan(((0, 1),), 3, 0.0))
        with pytest.raises(ConfigError, match="draft slot"):
            client.generate_many(prompts * 2, plan=Plan((tuple(range(8)),), 3, 0.0))


def test_the_verifier_is_calibrated_over_the_batches_it_reports():
    """Blocks sent several at a time share target passes; each verdict's batch size and time is
    a sample of eq. 17, so the fit sees b > 1 (the toy engine's passes take eq. 19's time)."""
    from edgekit.plan import calibrate_verify
    from edgekit.testing import ToyLanguageModel, toy_verifier
    from edgekit.verifier import Coefficients

    target = ToyLanguageModel(seed=5)
    transport = toy_verifier(target, max_sessions=8, cost=Coefficients(a=0.5, c=3.0))  # ms per token, per pass
    prompt = list(range(1, 40))
    shape = ModelShape(1, 64, 256)
    fp = target.fingerprint()
    runtime, samples = calibrate_verify(transport, fp, prompt, shape, windows=(1, 4), concurrency=(1, 4), repeats=3)
    sizes = {b for b, _, _ in samples}
    assert 1 in sizes and max(sizes) > 1  # concurrent blocks were verified together
    assert len(samples) == 2 * (1 + 4) * 3 and all(s > 0 for *_, s in samples)
    assert runtime.c1 >= 0 and runtime.c2 >= 0 and runtime.error(samples) < 0.5
