"""The predictor's delay schedule (issue 37, item 3): tabulated by replay at training, read
from the card, looked up each round from what the latency model says a round costs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edgekit import GenerationConfig
from edgekit.drafting import ControllerFactory, OnnxPredictor, PlainWhenFaster, PredictorController, shipped_cards
from edgekit.drafting._delay import DelaySchedule, StopPoint, round_cost_in_steps
from edgekit.errors import PredictorError
from edgekit.link import CostTracker, LinkEstimator, LinkPolicy
from edgekit.predictors.collect import Trace
from edgekit.predictors.features import FEATURE_NAMES
from edgekit.predictors.train import delay_schedule, replay_policy
from edgekit.runtime import DraftOutput


def calibrated_trace(rounds: int = 600, window: int = 8, seed: int = 0) -> tuple[Trace, np.ndarray]:
    """Rounds of `window` drafted tokens; each token is accepted with a known probability (its
    score, so the score is calibrated), up to the round's first rejection."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 1.0, size=(rounds, window))
    labels = np.full((rounds, window), -1, np.int8)
    for r in range(rounds):
        for j in range(window):
            if rng.random() < p[r, j]:
                labels[r, j] = 1
            else:
                labels[r, j] = 0
                break
    f = np.zeros((rounds * window, len(FEATURE_NAMES)), np.float32)
    f[:, FEATURE_NAMES.index("position")] = np.tile(np.arange(1, window + 1), rounds)
    trace = Trace(f, labels.reshape(-1), np.repeat(np.arange(rounds) // 10, window).astype(np.int32),
                  np.repeat(np.arange(rounds) % 10, window).astype(np.int32), {"window": window})
    return trace, p.reshape(-1)


def test_the_best_threshold_falls_as_rounds_grow_dear():
    trace, score = calibrated_trace()
    points = delay_schedule(trace, score, max_window=8, round_steps=(0.25, 4.0, 64.0), verify_token_steps=(0.0,),
                            operating=(0.5, "before"))
    cheap, middle, dear = points
    # a round cheaper than a draft step: one token a round beats any stopping rule
    assert (cheap["threshold"], cheap["max_window"]) == (0.0, 1)
    # the longer the wait, the longer the block worth its risk
    assert middle["threshold"] > 0.3
    assert dear["threshold"] < middle["threshold"]
    for p in points:
        # fixed windows and the operating point are candidates: the schedule never replays worse
        assert p["gain_over_best_fixed"] >= 0.0 and p["gain_over_operating_point"] >= -1e-12
    # the schedule's rule replays as it says
    from edgekit.predictors.train import CostModel

    cost = CostModel(draft_step_ms=1.0, round_ms=64.0)
    mine = replay_policy(trace, score >= dear["threshold"], cost, max_window=dear["max_window"], stop=dear["stop"])
    one = replay_policy(trace, score >= 0.5, cost, max_window=8, stop="before")
    assert mine["goodput_tok_s"] == pytest.approx(one["goodput_tok_s"] * (1 + dear["gain_over_operating_point"]))


def replay_one_round_at_a_time(trace, keep, cost, *, max_window=None, min_window=1, stop="before"):
    """The replay as a loop over rounds (as it was written before it was vectorised): the reference."""
    from edgekit.predictors.train import rounds_of

    t = rounds_of(trace)
    drafted = accepted = steps = 0
    time_ms = 0.0
    for first, n, acc in zip(t.first, t.drafted, t.accepted, strict=True):
        limit = min(n, max_window or n)
        k = min(min_window, limit)
        while k < limit and keep[first + k]:
            k += 1
        if k < limit and stop == "after":
            k += 1
            step = k
        else:
            step = k + 1 if k < limit else k
        drafted, accepted, steps = drafted + k, accepted + min(k, acc), steps + step
        time_ms += float(cost.round_time(np.array(step), np.array(k)))
    return drafted, accepted, steps, (accepted + len(t.first)) / (time_ms / 1e3)


@pytest.mark.parametrize("seed", range(4))
def test_the_vectorised_replay_is_the_loop(seed):
    from edgekit.predictors.train import CostModel

    rng = np.random.default_rng(seed)
    trace, score = calibrated_trace(rounds=120, window=int(rng.integers(3, 9)), seed=seed)
    cost = CostModel(draft_step_ms=float(rng.uniform(1, 20)), round_ms=float(rng.uniform(0, 100)),
                     verify_token_ms=float(rng.uniform(0, 5)))
    for max_window in (None, 1, 3, 20):
        for min_window in (0, 1, 2):
            for stop in ("before", "after"):
                keep = score >= rng.uniform(0.2, 1.0)
                got = replay_policy(trace, keep, cost, max_window=max_window, min_window=min_window, stop=stop)
                want = replay_one_round_at_a_time(trace, keep, cost, max_window=max_window, min_window=min_window,
                                                  stop=stop)
                assert (got["drafted"], got["accepted"], got["draft_steps"]) == want[:3]
                assert got["goodput_tok_s"] == pytest.approx(want[3])


def schedule() -> DelaySchedule:
    return DelaySchedule([
        StopPoint(1.0, 0.0, 0.9, "before", 2), StopPoint(32.0, 0.0, 0.1, "after", 8),
        StopPoint(1.0, 1.0, 0.0, "before", 1), StopPoint(32.0, 1.0, 0.3, "after", 8),
    ])


def test_lookup_takes_the_nearest_point_and_the_edges_beyond():
    s = schedule()
    assert s.at(1.0, 0.0).threshold == 0.9
    assert s.at(4.0, 0.1).threshold == 0.9  # log2: 4 is nearer 1 than 32
    assert s.at(8.0, 0.0).threshold == 0.1
    assert s.at(1000.0, 0.0).threshold == 0.1 and s.at(0.01, 0.0).threshold == 0.9
    assert s.at(1.0, 0.9).max_window == 1 and s.at(50.0, 7.0).threshold == 0.3


@pytest.mark.parametrize("entry, why", [
    ({"round_steps": 1.0, "verify_token_steps": 0.0, "threshold": 0.5, "stop": "sideways", "max_window": 4},
     "out of range"),
    ({"round_steps": 1.0, "verify_token_steps": 0.0, "threshold": 1.5, "stop": "after", "max_window": 4},
     "out of range"),
    ({"round_steps": 1.0, "threshold": 0.5, "stop": "after", "max_window": 4}, "malformed"),
    ({"round_steps": 1.0, "verify_token_steps": float("nan"), "threshold": 0.5, "stop": "after", "max_window": 4},
     "out of range"),
    ({"round_steps": 1.0, "verify_token_steps": 0.0, "threshold": 0.5, "stop": "after", "max_window": 2.9},
     "out of range"),
])
def test_a_malformed_schedule_is_refused_with_its_source(entry, why):
    with pytest.raises(PredictorError, match=f"card.json: a (malformed )?delay_schedule entry.*{why}|{why}"):
        DelaySchedule.from_card([entry], "card.json")
    with pytest.raises(PredictorError, match="at least one point"):
        DelaySchedule.from_card([], "card.json")


def policy_at(rtt_ms: float, costs: CostTracker | None = None) -> LinkPolicy:
    link = LinkEstimator()
    link.add_rtt(rtt_ms)
    return LinkPolicy(GenerationConfig(), link, hidden_dim=64, n_vocab=1000, costs=costs or CostTracker())


def test_round_cost_in_draft_steps_comes_from_the_latency_model():
    # the prior: 10 ms a draft step, verification 10 + 5 (K + 1) ms; no rates measured (no serialisation)
    rho, sigma = round_cost_in_steps(policy_at(100.0).model(), "tokens", 8)
    assert rho == pytest.approx((100.0 + 10.0) / 10.0) and sigma == pytest.approx(0.5)
    costs = CostTracker(draft_step_ms=40.0, verify_ms=(20.0, 0.0))
    rho, sigma = round_cost_in_steps(policy_at(0.0, costs).model(), "tokens", 8)
    assert rho == pytest.approx(0.5) and sigma == pytest.approx(0.0)


class HalfSure:
    """Every draft step's token: accepted with probability 0.5."""

    threshold = 0.7
    stop = "before"

    def p_accept_step(self, stats, position, recent_acceptance):
        return 0.5


def test_the_controller_follows_the_round_cost_each_round():
    step = DraftOutput(np.zeros(16, np.float32), None)
    flat = CostTracker(draft_step_ms=10.0, verify_ms=(10.0, 0.0))  # a verification costs a draft step
    near = PredictorController(HalfSure(), 8, schedule=schedule(), policy=policy_at(0.0, flat))
    assert near.name.endswith("+delay")
    # a round of one draft step: threshold 0.9, at most 2 tokens; a 0.5 token stops the block before it
    assert near.window(8) == 2 and (near.threshold, near.stop) == (0.9, "before")
    assert not near.draft_next(2, step)
    far = PredictorController(HalfSure(), 8, schedule=schedule(), policy=policy_at(300.0, flat))
    assert far.window(8) == 8 and (far.threshold, far.stop) == (0.1, "after")
    assert far.draft_next(5, step)
    assert far.window(3) == 3  # the room left still bounds the block
    # a verifier whose every block token costs a draft step: the per-token column
    dear = PredictorController(HalfSure(), 8, schedule=schedule(),
                               policy=policy_at(0.0, CostTracker(draft_step_ms=10.0, verify_ms=(0.0, 10.0))))
    assert dear.window(8) == 1
    with pytest.raises(Exception, match="link policy"):
        PredictorController(HalfSure(), 8, schedule=schedule())


def gemma_card() -> dict:
    return next(c for c in shipped_cards() if c["pair"] == "gemma-270m")


def test_shipped_predictors_carry_a_schedule_and_the_factory_uses_it():
    card = gemma_card()
    assert len(card["delay_schedule"]) == 50
    factory = ControllerFactory(card["draft"], card["target"])
    policy = policy_at(50.0)
    made = factory.build(GenerationConfig(drafting="predictor"), policy)
    assert made.name == "predictor-gemma-270m+delay" and made.schedule is not None
    auto = factory.build(GenerationConfig(drafting="auto"), policy)
    assert isinstance(auto, PlainWhenFaster) and auto.inner.name.endswith("+delay")
    # a threshold given, or the schedule turned off: one threshold for every round
    fixed = factory.build(GenerationConfig(drafting="predictor", predictor_threshold=0.4), policy)
    assert fixed.schedule is None and fixed.threshold == 0.4 and fixed.name == "predictor-gemma-270m"
    off = factory.build(GenerationConfig(drafting="predictor", predictor_schedule=False), policy)
    assert off.schedule is None and off.threshold == pytest.approx(card["threshold"])


def test_the_schedule_is_read_from_the_card_beside_the_model(tmp_path):
    card = gemma_card()
    onnx = tmp_path / "p.onnx"
    shutil.copy(card["path"], onnx)
    assert OnnxPredictor(onnx).schedule is None  # no card: the model's one operating threshold
    written = {k: v for k, v in card.items() if k != "path"}
    (tmp_path / "p.json").write_text(json.dumps(written))
    s = OnnxPredictor(onnx).schedule
    assert s is not None and len(s.points) == 50
    # a card that cannot be used costs the schedule, not the model: a warning says why
    written["delay_schedule"][3]["stop"] = "never"
    (tmp_path / "p.json").write_text(json.dumps(written))
    with pytest.warns(RuntimeWarning, match="p.json: a delay_schedule entry out of range"):
        assert OnnxPredictor(onnx).schedule is None
    (tmp_path / "p.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="its delay schedule is not used"):
        assert OnnxPredictor(onnx).schedule is None
    other = {**{k: v for k, v in card.items() if k != "path"}, "threshold": 0.9}  # another model's card
    (tmp_path / "p.json").write_text(json.dumps(other))
    with pytest.warns(RuntimeWarning, match="another model's card"):
        pred = OnnxPredictor(onnx)
    assert pred.schedule is None and pred.threshold == pytest.approx(card["threshold"])


def test_a_schedule_is_tabulated_on_the_traces_the_card_was_trained_on_only(tmp_path):
    from pathlib import Path

    from edgekit.errors import ConfigError
    from edgekit.predictors.pipeline import schedule_card

    card = gemma_card()
    stem = tmp_path / "g"
    shutil.copy(card["path"], stem.with_suffix(".onnx"))
    written = {k: v for k, v in card.items() if k != "path"}
    stem.with_suffix(".json").write_text(json.dumps(written))
    other = Trace.load(Path(card["path"]).parent.parent / "traces" / "qwen-coder.npz")
    with pytest.raises(ConfigError, match="not the ones g.json was trained on"):
        schedule_card(stem.with_suffix(".json"), other)
    assert json.loads(stem.with_suffix(".json").read_text()) == written  # nothing written
    stem.with_suffix(".json").write_text("{}")
    with pytest.raises(ConfigError, match="is not a predictor's metric card"):
        schedule_card(stem.with_suffix(".json"), other)
