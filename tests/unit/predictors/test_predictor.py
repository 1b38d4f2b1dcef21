"""The WISP predictor pieces: labelling, recording, the stop rule, training,
the ONNX round trip and refusal of unusable models, the shipped predictors."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit import ConfidenceThreshold, GenerationConfig
from edgekit.drafting import AcceptanceTracker, OnnxPredictor, PredictorController, shipped_cards
from edgekit.errors import PredictorError
from edgekit.predictors.collect import Trace, TraceRecorder, collect, label_round
from edgekit.predictors.features import FEATURE_NAMES, LogitFeatures
from edgekit.predictors.train import (
    CostModel,
    auc,
    classification_metrics,
    replay_policy,
    train_logistic,
    train_mlp,
)
from edgekit.runtime import DraftOutput
from edgekit.testing import ToyLanguageModel, toy_client

onnx = pytest.importorskip("onnx")
from edgekit.predictors.export import export_onnx  # noqa: E402  # only where onnx is installed


def fake_client(**gen):
    client = toy_client(ToyLanguageModel(seed=3, eos_bias=-6.0), noise=1.5, **gen)
    return client, client.draft, client.transport


# -- labelling -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "drafted, accepted, labels",
    [(4, 4, [1, 1, 1, 1]), (4, 0, [0, -1, -1, -1]), (5, 2, [1, 1, 0, -1, -1]), (3, 2, [1, 1, 0]), (0, 0, [])],
)
def test_label_round_marks_accepted_first_rejection_and_ignores_the_rest(drafted, accepted, labels):
    assert label_round(drafted, accepted) == labels


def test_label_round_rejects_impossible_verdicts():
    with pytest.raises(ValueError):
        label_round(2, 3)


def test_acceptance_tracker_counts_labelled_positions_only():
    t = AcceptanceTracker(alpha=0.5, initial=0.5)
    t.update(drafted=4, accepted=1)  # one accepted, one first rejection, two unlabelled
    assert t.value == pytest.approx((0.5 + 0.5 * 0.5) * 0.5)
    t.update(drafted=2, accepted=2)
    assert t.value == pytest.approx(1 - (1 - 0.375) * 0.25)


def test_recorded_trace_matches_the_rounds_that_ran():
    client, _, _verifier = fake_client(max_tokens=40, stop_at_eos=False)
    rec = TraceRecorder(5)
    final = client.generate("hello world", controller=rec, max_tokens=40).until_done()
    rounds = final.stats.rounds_detail
    assert len(rec.labels) == sum(r.drafted for r in rounds) == len(rec.rows)
    start = 0
    for r in rounds:
        assert rec.labels[start : start + r.drafted] == label_round(r.drafted, r.accepted)
        positions = [row[FEATURE_NAMES.index("position")] for row in rec.rows[start : start + r.drafted]]
        assert positions == list(range(1, r.drafted + 1))
        start += r.drafted
    # some rounds were rejected early, some accepted whole: both labels occur
    assert 0 in rec.labels and 1 in rec.labels and -1 in rec.labels


def test_collect_writes_a_trace_that_loads_back(tmp_path):
    client, _, _ = fake_client(stop_at_eos=False)
    prompts = [{"id": f"p{i}", "prompt": f"prompt number {i}"} for i in range(4)]
    trace = collect(client, prompts, window=6, max_tokens=30)
    assert trace.header["prompts"] == ["p0", "p1", "p2", "p3"]
    assert trace.header["cost_model"]["draft_step_ms"] > 0
    assert set(np.unique(trace.prompt)) == {0, 1, 2, 3}
    back = Trace.load(trace.save(tmp_path / "t.npz"))
    assert np.array_equal(back.features, trace.features) and np.array_equal(back.label, trace.label)
    assert back.header == trace.header
    assert (back.labelled().label >= 0).all()


# -- the stop rule ---------------------------------------------------------------------


class StubPredictor:
    """P(accepted) by block position: a scripted predictor."""

    def __init__(self, by_position: dict[int, float], threshold: float = 0.5) -> None:
        self.by_position = by_position
        self.threshold = threshold
        self.feature_names = FEATURE_NAMES
        self.seen: list[np.ndarray] = []
        from pathlib import Path

        self.path = Path("stub.onnx")

    def p_accept(self, features: np.ndarray) -> float:
        self.seen.append(features.copy())
        return self.by_position.get(int(features[FEATURE_NAMES.index("position")]), 1.0)

    def p_accept_step(self, stats, position: int, recent_acceptance: float) -> float:
        return self.p_accept(LogitFeatures()(stats, position, recent_acceptance))


def test_controller_stops_before_the_first_predicted_rejection():
    ctl = PredictorController(StubPredictor({3: 0.2}), max_window=8)
    client, _draft, verifier = fake_client(max_tokens=60, stop_at_eos=False)
    final = client.generate("stop rule", controller=ctl).until_done()
    # position 3 is predicted rejected: every block is at most 2 tokens, and the
    # token at position 3 never joins a block (nor is it sampled)
    assert all(len(b.draft_tokens) <= 2 for b in verifier.verify_calls)
    assert max(len(b.draft_tokens) for b in verifier.verify_calls) == 2
    # a stop costs one more draft step; a block the draft ended itself (EOS) does not
    steps = [r.draft_steps for r in final.stats.rounds_detail if r.drafted == 2]
    assert set(steps) <= {2, 3} and steps.count(3) > len(steps) / 2
    assert final.stats.drafting == "predictor-stub"


@pytest.mark.parametrize(("p", "longest"), [(0.5, 8), (0.499, 2)])
def test_a_token_predicted_at_the_threshold_is_drafted_and_one_just_under_it_is_not(p, longest):
    """The stop rule drafts where p >= threshold: the boundary itself belongs to drafting."""
    ctl = PredictorController(StubPredictor({3: p}, threshold=0.5), max_window=8)
    client, _draft, verifier = fake_client(max_tokens=60, stop_at_eos=False)
    client.generate("the boundary", controller=ctl).until_done()
    assert max(len(b.draft_tokens) for b in verifier.verify_calls) == longest


def test_stop_after_sends_the_predicted_rejection_and_ends_the_block():
    ctl = PredictorController(StubPredictor({3: 0.2}), max_window=8, stop="after")
    client, _, verifier = fake_client(max_tokens=60, stop_at_eos=False)
    final = client.generate("stop after", controller=ctl).until_done()
    assert max(len(b.draft_tokens) for b in verifier.verify_calls) == 3
    # no draft step is spent past the block: a round of 3 tokens took 3 steps
    assert {r.draft_steps for r in final.stats.rounds_detail if r.drafted == 3} == {3}


def test_no_decision_is_made_where_it_cannot_change_the_block():
    """The first token (the minimum window) is always drafted, and under the
    "after" rule the window's last token is sent whatever the predictor says:
    neither costs a decision. Under "before" the last one can still be dropped."""
    pos = FEATURE_NAMES.index("position")
    seen = {}
    for rule in ("after", "before"):
        stub = StubPredictor({})
        client, _, verifier = fake_client(max_tokens=30, stop_at_eos=False)
        client.generate("x", controller=PredictorController(stub, max_window=3, stop=rule)).until_done()
        assert max(len(b.draft_tokens) for b in verifier.verify_calls) == 3
        seen[rule] = {int(f[pos]) for f in stub.seen}
    assert seen == {"after": {2}, "before": {2, 3}}


def test_controller_keeps_the_minimum_window_and_the_maximum():
    client, _, verifier = fake_client(max_tokens=30, stop_at_eos=False)
    never = PredictorController(StubPredictor(dict.fromkeys(range(1, 65), 0.0)), max_window=8, min_window=1)
    client.generate("x", controller=never).until_done()
    assert {len(b.draft_tokens) for b in verifier.verify_calls} <= {1}
    verifier.verify_calls.clear()
    always = PredictorController(StubPredictor({}), max_window=3)
    client.generate("x", controller=always).until_done()
    assert max(len(b.draft_tokens) for b in verifier.verify_calls) == 3


def test_an_empty_block_is_a_target_only_step():
    client, _, _verifier = fake_client(max_tokens=20, stop_at_eos=False)
    never = PredictorController(StubPredictor(dict.fromkeys(range(1, 65), 0.0)), max_window=8, min_window=0)
    spec = client.generate("empty blocks", controller=never).until_done()
    base = client.generate_target_only("empty blocks", max_tokens=20).until_done()
    assert spec.token_ids == base.token_ids
    assert spec.stats.rounds == 20 and spec.stats.drafted == 0


def test_predictor_sees_the_tracked_acceptance():
    stub = StubPredictor({})
    ctl = PredictorController(stub, max_window=4)
    client, _, _ = fake_client(max_tokens=30, stop_at_eos=False)
    client.generate("abc", controller=ctl).until_done()
    col = FEATURE_NAMES.index("recent_acceptance")
    values = {round(float(f[col]), 6) for f in stub.seen}
    assert len(values) > 1 and values != {0.5}


def test_confidence_threshold_stops_on_a_flat_distribution():
    from edgekit import Decision

    ctl = ConfidenceThreshold(0.5, max_window=8)
    peaked = np.full(100, -20.0, dtype=np.float32)
    peaked[3] = 10.0
    flat = np.zeros(100, dtype=np.float32)
    peaked, flat = DraftOutput(peaked, None), DraftOutput(flat, None)
    assert ctl.draft_next(2, peaked) == Decision.DRAFT and ctl.draft_next(2, flat) == Decision.STOP
    assert ctl.draft_next(1, flat) == Decision.DRAFT  # the minimum window
    assert ctl.window(20) == 8 and ctl.window(3) == 3
    after = ConfidenceThreshold(0.5, max_window=8, stop="after")
    assert after.draft_next(2, flat) == Decision.LAST and after.name == "p-min-0.5-after"


def test_generation_config_picks_the_policy():
    client, _, _ = fake_client(max_tokens=20, stop_at_eos=False)
    assert client.controller_for(GenerationConfig(drafting="fixed", draft_k=3)).name == "fixed-3"
    assert client.controller_for(GenerationConfig(drafting="p-min", p_min=0.7)).name == "p-min-0.7"
    # no predictor is shipped for the toy models: auto falls back to the fixed window
    assert client.controller_for(GenerationConfig(drafting="auto", draft_k=5)).name == "fixed-5"
    from edgekit import ConfigError

    with pytest.raises(ConfigError, match="no predictor is shipped"):
        client.controller_for(GenerationConfig(drafting="predictor"))


def test_auto_without_a_loadable_onnxruntime_says_it_falls_back_to_the_fixed_window(monkeypatch, tmp_path):
    import sys

    from edgekit.drafting import _factory  # private: the shipped predictor's path, swapped for the test's

    client, _, _ = fake_client(max_tokens=20)
    monkeypatch.setattr(_factory, "shipped_predictor", lambda *a, **k: tmp_path / "shipped.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # importing it raises ImportError
    with pytest.warns(RuntimeWarning, match="onnxruntime cannot be loaded.*fixed 5 tokens"):
        assert client.controller_for(GenerationConfig(drafting="auto", draft_k=5)).name == "fixed-5"


# -- training and the ONNX round trip ----------------------------------------------------


def synthetic(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, len(FEATURE_NAMES)))
    logit = 2.0 * x[:, 0] - 1.5 * x[:, 1] + np.sin(2 * x[:, 2]) + 0.8
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    return x, y


def test_models_learn_a_known_rule():
    x, y = synthetic()
    xv, yv = synthetic(seed=1)
    lin = train_logistic(x, y)
    mlp = train_mlp(x, y, xv, yv, epochs=60, seed=0)
    assert auc(yv, lin.predict(xv)) > 0.8
    assert auc(yv, mlp.predict(xv)) > auc(yv, lin.predict(xv)) - 0.01
    # class weighting balances recall on the two classes at 0.5
    m = classification_metrics(yv, lin.predict(xv), 0.5)
    assert abs(m["recall_accepted"] - m["specificity"]) < 0.15


def test_auc_of_known_scores():
    y = np.array([0, 0, 1, 1])
    assert auc(y, np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert auc(y, np.array([0.4, 0.3, 0.2, 0.1])) == 0.0
    assert auc(y, np.array([0.5, 0.5, 0.5, 0.5])) == 0.5


@pytest.mark.parametrize("kind", ["logistic", "mlp"])
def test_onnx_export_reproduces_the_model(tmp_path, kind):
    x, y = synthetic()
    model = train_logistic(x, y) if kind == "logistic" else train_mlp(x, y, x[:500], y[:500], epochs=20)
    path = export_onnx(model, tmp_path / "p.onnx", feature_names=FEATURE_NAMES, threshold=0.37)
    pred = OnnxPredictor(path)
    assert pred.threshold == pytest.approx(0.37)
    assert pred.feature_names == FEATURE_NAMES
    batch = pred.p_accept_batch(x[:200].astype(np.float32))
    assert np.abs(batch - model.predict(x[:200])).max() < 1e-5
    assert pred.p_accept(x[7].astype(np.float32)) == pytest.approx(float(batch[7]), abs=1e-6)


def test_a_subset_of_features_is_selected_by_name(tmp_path):
    x, y = synthetic()
    names = ("entropy", "confidence")
    cols = [FEATURE_NAMES.index(n) for n in names]
    model = train_logistic(x[:, cols], y)
    pred = OnnxPredictor(export_onnx(model, tmp_path / "s.onnx", feature_names=names, threshold=0.5))
    assert np.abs(pred.p_accept_batch(x[:50].astype(np.float32)) - model.predict(x[:50, cols])).max() < 1e-5


def test_unusable_models_are_refused(tmp_path):
    with pytest.raises(PredictorError, match="no predictor at"):
        OnnxPredictor(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(PredictorError, match="not a usable ONNX model"):
        OnnxPredictor(junk)
    x, y = synthetic()
    three = train_logistic(x[:, :3], y)
    # no metadata: it must take all of FEATURE_NAMES
    path = export_onnx(three, tmp_path / "three.onnx", feature_names=FEATURE_NAMES[:3], threshold=0.5)
    m = onnx.load(str(path))
    del m.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(m, str(bare))
    with pytest.raises(PredictorError, match=r"expected tensor\(float\) \[N, 6\]"):
        OnnxPredictor(bare)
    entry = m.metadata_props.add()
    entry.key, entry.value = "edgekit.features", "confidence,entropy,perplexity"
    odd = tmp_path / "odd.onnx"
    onnx.save(m, str(odd))
    with pytest.raises(PredictorError, match="unknown features perplexity"):
        OnnxPredictor(odd)


# -- replay -----------------------------------------------------------------------------


def constructed_trace() -> Trace:
    """Two rounds of window 4: accepted 2 then rejected; all 4 accepted."""
    f = np.zeros((8, len(FEATURE_NAMES)), dtype=np.float32)
    f[:, FEATURE_NAMES.index("position")] = [1, 2, 3, 4, 1, 2, 3, 4]
    f[:, FEATURE_NAMES.index("confidence")] = [0.9, 0.8, 0.2, 0.9, 0.9, 0.9, 0.9, 0.3]
    label = np.array([1, 1, 0, -1, 1, 1, 1, 1], dtype=np.int8)
    return Trace(f, label, np.zeros(8, np.int32), np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32), {"window": 4})


def test_replay_of_fixed_windows_and_a_stop_rule():
    t = constructed_trace()
    cost = CostModel(draft_step_ms=10.0, round_ms=100.0)
    fixed4 = replay_policy(t, np.ones(8, bool), cost)
    assert (fixed4["drafted"], fixed4["accepted"], fixed4["wasted"], fixed4["rounds"]) == (8, 6, 2, 2)
    assert fixed4["goodput_tok_s"] == pytest.approx(8 / 0.28)  # 8 committed in 2 x (100 + 4 x 10) ms
    fixed2 = replay_policy(t, np.ones(8, bool), cost, max_window=2)
    assert (fixed2["drafted"], fixed2["accepted"]) == (4, 4)
    stop = replay_policy(t, t.features[:, 0] >= 0.5, cost)
    # round 1 stops before position 3 (drafts 2, 3 steps), round 2 before position 4 (3, 4 steps)
    assert (stop["drafted"], stop["accepted"], stop["wasted"], stop["draft_steps"]) == (5, 5, 0, 7)
    assert stop["acceptance_rate"] == 1.0
    after = replay_policy(t, t.features[:, 0] >= 0.5, cost, stop="after")
    # round 1 sends positions 1-3 (3 rejected), round 2 all 4: no extra steps
    assert (after["drafted"], after["accepted"], after["wasted"], after["draft_steps"]) == (7, 6, 1, 7)


# -- shipped predictors -------------------------------------------------------------------


def test_shipped_predictors_load_and_run():
    cards = shipped_cards()
    assert {c["pair"] for c in cards} >= {"gemma-270m", "qwen-coder"}
    for card in cards:
        pred = OnnxPredictor(card["path"])
        assert pred.threshold == pytest.approx(card["threshold"])
        assert list(pred.feature_names) == card["features"]
        confident = np.array([0.99, 0.05, 0.98, 5.0, 1, 0.8], dtype=np.float32)
        unsure = np.array([0.2, 3.5, 0.01, 4.0, 6, 0.3], dtype=np.float32)
        assert pred.p_accept(confident) > pred.threshold > pred.p_accept(unsure)
        assert card["metrics_validation"]["auc"] > 0.7
        # the drafting loop's path (features straight into the bound input) agrees with it
        rng = np.random.default_rng(3)
        for position in (2, 5):
            z = (rng.normal(size=4096) * 3).astype(np.float32)
            z[17] += 12.0 * position / 5
            stats = DraftOutput(z, None).stats
            full = LogitFeatures()(stats, position, 0.6).copy()
            assert pred.p_accept_step(stats, position, 0.6) == pytest.approx(pred.p_accept(full), abs=1e-7)


def test_the_shipped_gemma_predictor_is_reproducible_from_its_trace(tmp_path):
    """`make predictors` retrains from the committed trace; the figures must come back
    (to float tolerance: BLAS sums may differ in the last bits across machines)."""
    from pathlib import Path

    from edgekit.predictors.pipeline import train_from_trace

    card = next(c for c in shipped_cards() if c["pair"] == "gemma-270m")
    trace = Trace.load(Path(card["path"]).parent.parent / "traces" / "gemma-270m.npz")
    cost = CostModel(**card["cost_model"])
    again = train_from_trace(trace, tmp_path / "g", cost=cost, feature_names=tuple(card["features"]))
    assert again["model"] == card["model"]
    assert again["metrics_validation"]["auc"] == pytest.approx(card["metrics_validation"]["auc"], abs=0.005)
    got, want = again["replay_validation"]["predictor"], card["replay_validation"]["predictor"]
    assert got["goodput_tok_s"] == pytest.approx(want["goodput_tok_s"], rel=0.01)
