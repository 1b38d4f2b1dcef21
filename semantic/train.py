"""From a trace directory to a shipped head: one call, reproducible (seeded), with its metric card.

`train_from_traces` reads the labelled episodes, splits them by task into
training and validation, builds the relabeled CSI instances (or, for the
ablation, the base labels alone), trains the head, picks its threshold on the
validation mismatches, measures it on both links, exports the ONNX and writes
the card (`.json` figures, `.md` to read) beside it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from edgekit.predictors.train import auc
from edgekit.verifier import TARGET_FEATURES, channel_quality

from .collect import TraceSet
from .head import (
    GOOD_LINK,
    PERFECT_LINK,
    POOR_LINK,
    evaluate,
    export_head,
    features_for,
    labelled_episodes,
    make_dataset,
    pick_threshold,
    split_episodes,
    train_head,
)
from .relabel import RelabelConfig
from .tasks import is_heldout

__all__ = ["train_from_traces"]


def _source(task_id: str) -> str:
    return task_id.split("/")[0]


def train_from_traces(
    traces: str | Path,
    out: str | Path,
    *,
    csi: bool = True,
    target_features: bool = False,
    draws: int = 8,
    critical_recall: float = 0.9,
    hidden: int = 32,
    rank: int | None = 16,
    seed: int = 0,
    relabel: RelabelConfig = RelabelConfig(),
) -> dict:
    """Trains, exports `out` (.onnx) and its card; returns the card."""
    ts = TraceSet(traces)
    episodes = labelled_episodes(ts)
    if len(episodes) < 4:
        raise ValueError(f"{ts.root} has {len(episodes)} fully labelled episodes; run `edgekit semantic label`")
    held_out = sorted({e.task_id for e in episodes if is_heldout(e.task_id)})
    if held_out:
        raise ValueError(f"{ts.root} holds held-out HumanEval problems ({', '.join(held_out[:5])}); "
                         "they are for evaluation only")
    train_eps, stop_eps, val_eps = split_episodes(episodes, seed=seed)
    tf = target_features
    train = make_dataset(train_eps, csi=csi, target_features=tf, draws=draws, config=relabel, seed=seed)
    stop = make_dataset(stop_eps, csi=csi, target_features=tf, draws=draws, config=relabel, seed=seed + 1)
    meta = ts.meta
    n_hidden = int(meta["draft_hidden"]) + int(meta["target_hidden"])
    model = train_head(train, stop, n_hidden=n_hidden, rank=rank, hidden=hidden, seed=seed)
    # the threshold: on the calibration mismatches at a perfect link (no CSI: as they are)
    x_val, crit_val = features_for(val_eps, PERFECT_LINK if csi else None, target_features=tf)
    threshold = pick_threshold(model.predict(x_val), crit_val, critical_recall)
    figures = evaluate(model, val_eps, threshold, csi=csi, target_features=tf)
    train_auc = auc(train.critical.astype(float), model.predict(train.x.astype(np.float64)))
    n_mism = sum(len(e.positions) for e in episodes)
    n_crit = int(sum(e.critical.sum() for e in episodes))
    card = {
        "pair": meta.get("pair", ""),
        "draft": meta["draft"],
        "target": meta["target"],
        "kind": "semantic-head",
        "csi": csi,
        "target_features": list(TARGET_FEATURES) if tf else [],
        "threshold": threshold,
        "threshold_rule": f"largest rejecting >= {critical_recall:.0%} of critical validation mismatches at q = 1",
        "model": {"hidden": hidden, "rank": rank or 0, "dropout": 0.3, "weight_decay": 3e-3, "seed": seed},
        "relabel": {"decay_tokens": relabel.decay_tokens, "beta_min": relabel.beta_min,
                    "temperature": relabel.temperature, "draws_per_episode": draws if csi else 0},
        "data": {
            "episodes": len(episodes),
            "mismatches": n_mism,
            "critical": n_crit,
            "by_source": dict(Counter(_source(e.task_id) for e in episodes)),
            "mismatches_by_source": dict(sum((Counter({_source(e.task_id): len(e.positions)}) for e in episodes),
                                             Counter())),
            "train_episodes": len(train_eps),
            "early_stopping_episodes": len(stop_eps),
            "validation_episodes": len(val_eps),
            "train_instances": len(train.y),
            "validation_mismatches": len(crit_val),
            "validation_critical": int(crit_val.sum()),
        },
        "train_auc_base_labels": train_auc,
        "validation": figures,
        "links": {"good": {"rtt_ms": GOOD_LINK.rtt_ms, "mbps": GOOD_LINK.uplink_mbps,
                           "quality": channel_quality(GOOD_LINK)},
                  "poor": {"rtt_ms": POOR_LINK.rtt_ms, "mbps": POOR_LINK.uplink_mbps,
                           "quality": channel_quality(POOR_LINK)}},
    }
    out = Path(out)
    export_head(
        model, out, draft_hidden=int(meta["draft_hidden"]), target_hidden=int(meta["target_hidden"]), csi=csi,
        threshold=threshold, target_features=tf,
        metadata={"edgekit.pair": card["pair"], "edgekit.draft": card["draft"], "edgekit.target": card["target"]},
    )
    out.with_suffix(".json").write_text(json.dumps(card, indent=1) + "\n")
    out.with_suffix(".md").write_text(_card_markdown(card))
    return card


def _card_markdown(card: dict) -> str:
    d, v = card["data"], card["validation"]
    lines = [
        f"# Semantic head: {card['pair']} ({card['draft']} drafting for {card['target']})",
        "",
        f"Two-layer MLP (hidden {card['model']['hidden']}, dropout {card['model']['dropout']}, weight decay "
        f"{card['model']['weight_decay']}) on [h_draft, h_target"
        f"{', ' + ', '.join(card['target_features']) if card.get('target_features') else ''}"
        f"{', CSI' if card['csi'] else ''}]"
        + (f", its first layer of rank {card['model']['rank']} (the hidden rows' principal directions)"
           if card["model"].get("rank") else "")
        + "; "
        f"P(reject) > {card['threshold']:.4f} rejects a mismatch ({card['threshold_rule']}).",
        "",
        "## Data",
        "",
        f"- {d['episodes']} episodes (tasks), {d['mismatches']} task-labelled mismatches, {d['critical']} critical "
        f"(the task's outcome changed when the draft's token was kept).",
        f"- Episodes by source: {d['by_source']}; mismatches by source: {d['mismatches_by_source']}.",
        f"- Split by task: {d['train_episodes']} training episodes ({d['train_instances']} instances"
        + (f", {card['relabel']['draws_per_episode']} CSI draws each, relabeled by eqs. 28-31" if card["csi"] else
           ", base labels")
        + f"), {d['early_stopping_episodes']} for early stopping, {d['validation_episodes']} for calibration "
        f"({d['validation_mismatches']} mismatches, {d['validation_critical']} critical): the threshold was chosen "
        "on these, so the confusion below is optimistic by construction; the held-out HumanEval evaluation "
        "(benchmarks/semantic.py) is the independent test. No held-out HumanEval problem is in any split.",
        "",
        "## Calibration split (base labels: positive = critical)",
        "",
        "| link | quality q | AUC | mismatches accepted | critical rejected (tp) | critical accepted (fn) | "
        "harmless accepted (tn) | harmless rejected (fp) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("good_link", "poor_link"):
        f = v[name]
        c = f["confusion"]
        lines.append(
            f"| {name.replace('_', ' ')} | {f['quality']:.3f} | {f['auc']:.3f} | {f['accepted_share']:.1%} | "
            f"{c['tp']} | {c['fn']} | {c['tn']} | {c['fp']} |"
        )
    lines += ["", f"Training AUC on base labels: {card['train_auc_base_labels']:.3f}.", ""]
    return "\n".join(lines)
