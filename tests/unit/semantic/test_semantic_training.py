"""The semantic head's training pipeline: tasks and their checks, relabeling (eqs. 28-31),
datasets, training, threshold, export and the `edgekit semantic` commands, on synthetic traces."""

from __future__ import annotations

import json
from textwrap import dedent

import numpy as np
import pytest
from _transcript import normalise, normalise_json, transcript
from typer.testing import CliRunner

from edgekit.cli.app import app
from edgekit.semantic import tasks as T
from edgekit.semantic.collect import TraceSet
from edgekit.semantic.csi import sample_links
from edgekit.semantic.head import GOOD_LINK, POOR_LINK, labelled_episodes, make_dataset, pick_threshold
from edgekit.semantic.relabel import RelabelConfig, relabel_episode, repair_budget, smoothed_importance
from edgekit.verifier import SemanticHead, channel_quality

# A head trained in a test is compared bit for bit: its card came out identical (all 38 real numbers,
# the threshold among them) with numpy's SIMD at AVX-512, AVX2 and SSE4 (NPY_DISABLE_CPU_FEATURES) and
# OpenBLAS's SkylakeX, Haswell, Sandybridge and Prescott kernels (OPENBLAS_CORETYPE), measured.
WIDE = {"COLUMNS": "2000"}  # a console wide enough that an error's panel never wraps
USAGE = "Usage: edgekit semantic train [OPTIONS] {traces}\nTry 'edgekit semantic train --help' for help.\n"

# -- tasks ------------------------------------------------------------------------------------


def test_humaneval_splits_by_problem_number_and_never_overlap():
    train, held = T.humaneval_tasks("train"), T.humaneval_tasks("heldout")
    assert len(train) == len(held) == 82
    ids_train, ids_held = {t.id for t in train}, {t.id for t in held}
    assert not ids_train & ids_held and len(ids_train | ids_held) == 164
    assert all(int(i.split("/")[1]) % 2 == 0 for i in ids_train)


def test_a_humaneval_check_runs_the_problems_tests():
    task = next(t for t in T.humaneval_tasks("train") if t.id == "HumanEval/2")  # truncate_number
    assert task.check("    return number % 1.0\n")
    assert not task.check("    return number\n")
    assert not task.check("    return (\n")  # a syntax error fails


def test_word_problems_know_their_answers():
    tasks = T.word_problems(16, seed=3)
    assert len({t.id for t in tasks}) == 16 and all(t.chat for t in tasks)
    assert tasks == T.word_problems(16, seed=3)  # reproducible from the seed
    farm = T.word_problems(6, seed=1)[5]  # the chickens-and-cows template
    a, b = (int(x) for x in __import__("re").findall(r"\d+", farm.prompt)[:2])
    assert farm.check(f"Each chicken has 2 legs...\nAnswer: {2 * a + 4 * b}")
    assert farm.check(f"Answer: {2 * a + 4 * b:,}")  # thousands separators
    assert not farm.check(f"Answer: {2 * a + 4 * b + 1}") and not farm.check("no number")
    with pytest.raises(ValueError, match="unknown task source"):
        T.task_set("gsm8k:10")


# -- relabeling -------------------------------------------------------------------------------


def test_smoothed_importance_weighs_clusters_of_critical_mismatches():
    pos = np.array([0, 2, 4, 40, 43, 80])
    crit = np.array([1, 1, 0, 1, 0, 0])
    s = smoothed_importance(pos, crit, decay_tokens=8.0)
    assert np.all((s >= 0) & (s <= 1))
    assert s[0] > s[3]  # among critical ones: one in a cluster outweighs one among harmless ones
    assert s[2] > 0.5 > 0.01 > s[5]  # a harmless mismatch near critical ones has importance, a far one little
    assert smoothed_importance(np.array([5]), np.array([1]), 8.0)[0] == 1.0


def test_relabeling_is_one_way_and_repairs_less_as_the_channel_worsens():
    pos = np.array([3, 9, 10, 30, 55, 56, 90])
    crit = np.array([0, 1, 1, 0, 1, 0, 1])
    cfg = RelabelConfig()
    shares = []
    for q in (1.0, 0.8, 0.5, 0.2, 0.0):
        pi = relabel_episode(pos, crit, q, cfg)
        assert np.all(pi[crit == 0] == 0)  # eq. 29: only critical mismatches are ever repaired
        assert pi[crit == 1].sum() == pytest.approx(min(repair_budget(4, q, cfg.beta_min), 4.0), abs=0.05)
        shares.append(pi.sum())
    assert shares == sorted(shares, reverse=True) and shares[0] > 3.9 and shares[-1] < 4 * cfg.beta_min + 0.05
    # the lower-importance (isolated) critical mismatch is relaxed first
    pi = relabel_episode(pos, crit, 0.2, cfg)
    s = smoothed_importance(pos, crit, cfg.decay_tokens)
    order = np.argsort(s[crit == 1])
    assert np.all(np.diff(pi[crit == 1][order]) >= -1e-12)
    assert np.all(relabel_episode(pos, np.zeros(7), 0.1, cfg) == 0)


def test_sampled_links_span_good_and_poor_channels():
    q = np.array([channel_quality(link) for link in sample_links(400, np.random.default_rng(0))])
    assert q.min() < 0.1 and q.max() > 0.9 and 0.2 < np.median(q) < 0.8


# -- a synthetic trace directory ------------------------------------------------------------------


def _synthetic_traces(root, *, n_episodes: int = 40, d_draft: int = 6, d_target: int = 4, seed: int = 0,
                      by_margin: bool = False):
    """Episodes whose critical mismatches are the ones with h_draft[0] > 1: learnable (with
    `by_margin`, the ones where the target's margin, a target feature, is above 2)."""
    rng = np.random.default_rng(seed)
    (root / "episodes").mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"pair": "synthetic", "draft": "d", "target": "t",
                                                "draft_hidden": d_draft, "target_hidden": d_target}))
    with open(root / "episodes.jsonl", "w") as eps, open(root / "labels.jsonl", "w") as labels:
        for i in range(n_episodes):
            m = int(rng.integers(3, 9))
            pos = np.sort(rng.choice(200, m, replace=False)).astype(np.int32)
            h_d = rng.normal(size=(m, d_draft)).astype(np.float16)
            h_t = rng.normal(size=(m, d_target)).astype(np.float16)
            feats = np.abs(rng.normal(size=(m, 4)) * 2).astype(np.float32)
            crit = feats[:, 3] > 2.0 if by_margin else h_d[:, 0] > 1.0
            np.savez(root / "episodes" / f"{i}.npz", positions=pos, draft_tokens=pos + 1, target_tokens=pos + 2,
                     h_draft=h_d, h_target=h_t, target_features=feats)
            eps.write(json.dumps({"index": i, "task_id": f"synthetic/{i}", "answer": [], "text": "",
                                  "passed": True, "mismatches": m}) + "\n")
            for p, c in zip(pos, crit):
                labels.write(json.dumps({"episode": i, "position": int(p), "task_id": f"synthetic/{i}",
                                         "critical": bool(c)}) + "\n")
    return root


def test_datasets_relabel_per_csi_draw_and_keep_base_labels_without(tmp_path):
    traces = TraceSet(_synthetic_traces(tmp_path / "t"))
    eps = labelled_episodes(traces)
    assert len(eps) == 40
    base = make_dataset(eps, csi=False)
    assert base.x.shape[1] == 10 and np.array_equal(base.y, base.critical)
    relabeled = make_dataset(eps, csi=True, draws=4)
    assert relabeled.x.shape == (4 * len(base.y), 14) and len(np.unique(relabeled.quality)) > 4
    assert np.all(relabeled.y[relabeled.critical == 0] == 0)  # one-way
    soft = make_dataset(eps, csi=True, links=[GOOD_LINK, POOR_LINK])
    good = (soft.quality == channel_quality(GOOD_LINK)) & (soft.critical == 1)
    poor = (soft.quality == channel_quality(POOR_LINK)) & (soft.critical == 1)
    assert good.sum() == poor.sum() == base.critical.sum()
    assert soft.y[good].mean() > 0.9 and soft.y[poor].mean() < soft.y[good].mean() - 0.2  # B(q) = n (0.4 + 0.6 q)
    # an episode with an unlabelled mismatch is left out whole
    lines = (tmp_path / "t" / "labels.jsonl").read_text().splitlines()
    (tmp_path / "t" / "labels.jsonl").write_text("\n".join(lines[1:]) + "\n")
    assert len(labelled_episodes(TraceSet(tmp_path / "t"))) == 39


def test_the_threshold_keeps_the_asked_share_of_critical_rejections():
    p = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.9])
    crit = np.array([0, 1, 0, 1, 0, 1])
    t = pick_threshold(p, crit, 1.0)
    assert np.all(p[crit == 1] > t) and t < 0.2 and t > 0.1
    t2 = pick_threshold(p, crit, 0.6)  # 2 of 3
    assert (p[crit == 1] > t2).sum() == 2 and t2 < 0.6


def test_train_exports_a_head_and_its_card_from_the_command_line(tmp_path):
    traces = _synthetic_traces(tmp_path / "t", n_episodes=80)
    runner = CliRunner()
    out = tmp_path / "head.onnx"
    r = runner.invoke(app, ["semantic", "train", str(traces), "-o", str(out), "--json"])
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert normalise_json(r.stdout, {}) == transcript("semantic-train-synthetic.json")
    card = json.loads(r.stdout)
    assert card["validation"]["good_link"]["auc"] > 0.85  # the rule is learnable from h_draft
    head = SemanticHead(out)
    assert head.uses_csi and (head.draft_hidden, head.target_hidden) == (6, 4)
    assert head.threshold == pytest.approx(card["threshold"])
    assert out.with_suffix(".md").read_text().startswith("# Semantic head: synthetic")
    # the ONNX gives the trained model's probabilities: critical rows score above harmless ones
    hi = np.array([[2.0, 0, 0, 0, 0, 0]], dtype=np.float32)
    lo = np.array([[-2.0, 0, 0, 0, 0, 0]], dtype=np.float32)
    t = np.zeros((1, 4), dtype=np.float32)
    assert head.p_reject(hi, t, GOOD_LINK)[0] > head.p_reject(lo, t, GOOD_LINK)[0]
    # relabeling repairs fewer critical mismatches on a poor link (eq. 30): the head learnt it
    assert head.p_reject(hi, t, POOR_LINK)[0] < head.p_reject(hi, t, GOOD_LINK)[0]
    ablation = tmp_path / "nocsi.onnx"
    r = runner.invoke(app, ["semantic", "train", str(traces), "-o", str(ablation), "--no-csi"])
    assert r.exit_code == 0 and r.stdout == "", r.output
    assert normalise(r.stderr, {tmp_path: "<tmp>"}) == dedent("""\
        wrote <tmp>/nocsi.onnx (threshold 0.3241) and its card <tmp>/nocsi.md
          good link: AUC 0.957, 75.3% of validation mismatches accepted, critical accepted 1 of 15
          poor link: AUC 0.957, 75.3% of validation mismatches accepted, critical accepted 1 of 15
        """)
    assert not SemanticHead(ablation).uses_csi


def test_a_head_trained_on_the_targets_confidence_reads_it(tmp_path):
    traces = _synthetic_traces(tmp_path / "t", n_episodes=80, by_margin=True)
    runner = CliRunner()
    out = tmp_path / "conf.onnx"
    r = runner.invoke(app, ["semantic", "train", str(traces), "-o", str(out), "--target-features", "--json"])
    assert r.exit_code == 0 and r.stderr == "", r.output
    # with the four target features
    assert normalise_json(r.stdout, {}) == transcript("semantic-train-target-features.json")
    card = json.loads(r.stdout)
    assert card["validation"]["good_link"]["auc"] > 0.85  # the rule is learnt from the margin
    head = SemanticHead(out)
    assert head.uses_target_features and head.uses_csi and head.width == 6 + 4 + 4 + 4
    h_d, h_t = np.zeros((2, 6), dtype=np.float32), np.zeros((2, 4), dtype=np.float32)
    logits = np.zeros((2, 8), dtype=np.float32)
    logits[0, 0] = logits[1, 0] = 6.0
    logits[0, 5] = 5.9  # row 0: a near-tie with the draft's token 5; row 1: the target sure of its 0
    p = head.p_reject(h_d, h_t, GOOD_LINK, logits, np.array([5, 5]))
    assert p[1] > p[0]
    assert "target_margin" in out.with_suffix(".md").read_text()
    # traces without the features: a clear error naming the way to add them
    for f in (tmp_path / "t" / "episodes").glob("*.npz"):
        with np.load(f) as z:
            arrays = {k: z[k] for k in z.files if k != "target_features"}
        np.savez(f, **arrays)
    r = runner.invoke(app, ["semantic", "train", str(traces), "-o", str(out), "--target-features"], env=WIDE)
    assert (r.exit_code, r.stdout) == (2, "")
    assert normalise(r.stderr) == USAGE + (
        "╭─ Error ─╮\n"
        "│ Invalid value: episode 0 (synthetic/0) has no target confidence features: run `edgekit semantic collect` "
        "on its trace directory again to add them │\n"
        "╰─╯\n"
    )


def test_a_low_rank_head_folds_its_projection_into_the_first_layer():
    from edgekit.predictors.train import train_mlp
    from edgekit.semantic.head import Projection

    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(size=(300, 12)) * rng.uniform(0.5, 3, 12) + 1.0, rng.uniform(0, 1, (300, 2))])
    y = ((x[:, 0] + x[:, 12]) > 1.5).astype(float)
    proj = Projection.fit(x, n_hidden=12, rank=5)
    assert proj.basis.shape == (12, 5) and proj.apply(x).shape == (300, 7)
    small = train_mlp(proj.apply(x), y, proj.apply(x), y, hidden=(8,), epochs=20, seed=0, dropout=0.3)
    folded = proj.fold(small)
    assert folded.weights[0].shape == (14, 8) and np.linalg.matrix_rank(folded.weights[0][:12]) <= 5
    probe = rng.normal(size=(50, 14)) * 2
    assert np.allclose(folded.predict(probe), small.predict(proj.apply(probe)), atol=1e-9)
    assert Projection.fit(x[:4], n_hidden=12, rank=16).basis.shape == (12, 4)  # no more directions than rows


def test_train_refuses_traces_without_labels(tmp_path):
    root = _synthetic_traces(tmp_path / "t", n_episodes=3)
    (root / "labels.jsonl").unlink()
    r = CliRunner().invoke(app, ["semantic", "train", str(root), "-o", str(tmp_path / "h.onnx")], env=WIDE)
    assert (r.exit_code, r.stdout) == (2, "")
    assert normalise(r.stderr, {tmp_path: "<tmp>"}) == USAGE + (
        "╭─ Error ─╮\n"
        "│ Invalid value: <tmp>/t has 0 fully labelled episodes; run `edgekit semantic label` │\n"
        "╰─╯\n"
    )
    r = CliRunner().invoke(app, ["semantic", "train", str(tmp_path / "nothing"), "-o", str(tmp_path / "h.onnx")],
                           env=WIDE)
    assert (r.exit_code, r.stdout) == (2, "")
    assert normalise(r.stderr, {tmp_path: "<tmp>"}) == USAGE + (
        "╭─ Error ─╮\n"
        "│ Invalid value: <tmp>/nothing holds no traces (no episodes.jsonl); run `edgekit semantic collect` │\n"
        "╰─╯\n"
    )


def test_held_out_problems_are_refused_for_tracing_and_training(tmp_path):
    from edgekit import ConfigError
    from edgekit.semantic.collect import collect

    held = T.humaneval_tasks("heldout")[:1]
    with pytest.raises(ConfigError, match="held-out HumanEval"):
        collect(held, "draft.gguf", "target.gguf", tmp_path / "t")  # refused before any model loads
    assert T.is_heldout("HumanEval/7") and not T.is_heldout("HumanEval/8") and not T.is_heldout("word/0/7")
    root = _synthetic_traces(tmp_path / "s", n_episodes=12)
    lines = [json.loads(x) for x in (root / "episodes.jsonl").read_text().splitlines()]
    lines[3]["task_id"] = "HumanEval/33"
    (root / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    from edgekit.semantic.train import train_from_traces

    with pytest.raises(ValueError, match="HumanEval/33"):
        train_from_traces(root, tmp_path / "h.onnx")


def test_threshold_edges_and_float32():
    p = np.array([0.3, 0.7], dtype=np.float64)
    crit = np.array([1, 1])
    assert pick_threshold(p, crit, 0.0) == 1.0  # nothing need be rejected
    t = pick_threshold(p, crit, 1.0)
    # compared in float32 on the verifier: both critical scores stay above it there
    assert np.all(p.astype(np.float32) > np.float32(t)) and t == float(np.float32(t))


def test_splits_are_by_task_and_never_empty(tmp_path):
    from edgekit.semantic.head import split_episodes

    eps = labelled_episodes(TraceSet(_synthetic_traces(tmp_path / "t", n_episodes=40)))
    parts = split_episodes(eps)
    assert sum(len(p) for p in parts) == 40 and all(parts)
    ids = [{e.task_id for e in p} for p in parts]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert all(split_episodes(eps[:k]) for k in (3, 4, 5)) and all(all(p) for p in split_episodes(eps[:3]))
