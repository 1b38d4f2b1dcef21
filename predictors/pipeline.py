"""From a trace to a shipped predictor: fit, pick the operating point, compare
with the fixed-window and confidence-threshold policies, export, write the card.

`train_from_trace` is what `edgekit predictor train` runs; it writes
`<stem>.onnx`, `<stem>.json` (the metric card, machine-readable) and
`<stem>.md` (the same for people). Everything is seeded: the same trace and
options give the same files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from edgekit.errors import ConfigError

from .collect import Trace
from .features import FEATURE_NAMES
from .train import (
    DEFAULT_FEATURES,
    CostModel,
    LinearModel,
    Mlp,
    best_threshold,
    classification_metrics,
    delay_schedule,
    features_matrix,
    replay_policy,
    split_by_prompt,
    train_logistic,
    train_mlp,
)

__all__ = ["schedule_card", "train_from_trace"]


def _ablation(
    x_tr: np.ndarray, y_tr: np.ndarray, x_va: np.ndarray, y_va: np.ndarray, names: tuple[str, ...]
) -> dict:
    """Validation AUC of logistic regression on all features and with each one dropped."""
    from .train import auc

    full = auc(y_va, train_logistic(x_tr, y_tr).predict(x_va))
    out = {"all": full}
    for j, name in enumerate(names):
        keep = [i for i in range(len(names)) if i != j]
        out[f"without {name}"] = auc(y_va, train_logistic(x_tr[:, keep], y_tr).predict(x_va[:, keep]))
    return out


def train_from_trace(
    trace: Trace,
    out_stem: str | os.PathLike[str],
    *,
    cost: CostModel | None = None,
    max_window: int | None = None,
    feature_names: tuple[str, ...] = DEFAULT_FEATURES,
    hidden: tuple[int, ...] = (32, 16),
    seed: int = 0,
) -> dict:
    from edgekit.drafting import OnnxPredictor

    from .export import export_onnx

    header = trace.header
    window = int(header.get("window", 8))
    max_window = max_window or window
    if max_window > window:
        raise ConfigError(f"the trace drafted {window} tokens per round; it cannot evaluate a window of {max_window}")
    cost = cost or CostModel(draft_step_ms=float(header["cost_model"]["draft_step_ms"]))
    train_rows, val_rows = split_by_prompt(trace, 0.2, seed)
    tr, va = trace.rows(train_rows), trace.rows(val_rows)
    trl, val = tr.labelled(), va.labelled()
    x_tr, y_tr = features_matrix(trl, feature_names), trl.label.astype(np.float64)
    x_va, y_va = features_matrix(val, feature_names), val.label.astype(np.float64)
    if len(np.unique(y_tr)) < 2 or len(np.unique(y_va)) < 2:
        raise ConfigError("the trace needs both accepted tokens and rejections in its training and validation prompts")

    models: dict[str, LinearModel | Mlp] = {
        "logistic": train_logistic(x_tr, y_tr),
        "mlp": train_mlp(x_tr, y_tr, x_va, y_va, hidden=hidden, seed=seed),
    }
    x_all_va = features_matrix(va, feature_names)
    candidates: dict[str, dict] = {}
    for kind, model in models.items():
        thr, stop, replay = best_threshold(va, model.predict(x_all_va), cost, max_window=max_window)
        candidates[kind] = {
            "threshold": thr,
            "stop": stop,
            "replay": replay,
            "metrics": classification_metrics(y_va, model.predict(x_va), thr),
        }
    conf = va.features[:, FEATURE_NAMES.index("confidence")]
    p_min, p_min_stop, p_min_replay = best_threshold(va, conf, cost, max_window=max_window)
    # the p-min baseline as llama.cpp runs it (the unsure token is dropped), for comparison
    llama_p_min = best_threshold(va, conf, cost, max_window=max_window, stops=("before",))
    fixed = {
        str(k): replay_policy(va, np.ones(len(va.label), bool), cost, max_window=k) for k in range(1, max_window + 1)
    }
    best_fixed = max(fixed, key=lambda k: fixed[k]["goodput_tok_s"])
    chosen = max(candidates, key=lambda k: candidates[k]["replay"]["goodput_tok_s"])
    model, threshold, stop = models[chosen], candidates[chosen]["threshold"], candidates[chosen]["stop"]

    out_stem = Path(out_stem)
    pair = header.get("pair", "")
    onnx_path = export_onnx(
        model,
        out_stem.with_suffix(".onnx"),
        feature_names=feature_names,
        threshold=threshold,
        metadata={"edgekit.draft": header.get("draft", ""), "edgekit.target": header.get("target", ""),
                  "edgekit.pair": pair, "edgekit.model": chosen, "edgekit.stop": stop},
    )
    # The exported graph must reproduce the numpy model.
    exported = OnnxPredictor(onnx_path, schedule=False)  # an earlier card may still lie beside it
    onnx_p = exported.p_accept_batch(val.features)
    onnx_max_diff = float(np.abs(onnx_p - model.predict(x_va)).max())
    # tabulated on the exported model's scores, as the drafting loop will compute them
    schedule = delay_schedule(va, exported.p_accept_batch(va.features), max_window=max_window,
                              operating=(threshold, stop))

    labelled = trace.labelled()
    card = {
        "pair": pair,
        "draft": header.get("draft"),
        "target": header.get("target"),
        "mode": header.get("mode", "greedy"),
        "model": chosen,
        "architecture": (f"MLP {len(feature_names)}-" + "-".join(map(str, hidden)) + "-1, ReLU, sigmoid")
        if chosen == "mlp" else f"logistic regression on {len(feature_names)} features",
        "features": list(feature_names),
        "threshold": threshold,
        "stop": stop,
        "max_window": max_window,
        "metrics_validation": candidates[chosen]["metrics"],
        "cost_model": {"draft_step_ms": cost.draft_step_ms, "round_ms": cost.round_ms,
                       "verify_token_ms": cost.verify_token_ms},
        "replay_validation": {
            "predictor": candidates[chosen]["replay"],
            **{f"{k} (threshold {v['threshold']:.3f}, stop {v['stop']})": v["replay"] for k, v in candidates.items()},
            f"p-min {p_min:.3f} (stop {p_min_stop})": p_min_replay,
            f"p-min {llama_p_min[0]:.3f} (stop before, as llama.cpp)": llama_p_min[2],
            **{f"fixed-{k}": v for k, v in fixed.items()},
        },
        "best_fixed_window": int(best_fixed),
        "delay_schedule": schedule,
        "best_p_min": {"p_min": p_min, "stop": p_min_stop},
        "best_p_min_llama": {"p_min": llama_p_min[0], "stop": "before"},
        "candidates": {k: {"threshold": v["threshold"], "stop": v["stop"], "metrics": v["metrics"]}
                       for k, v in candidates.items()},
        "feature_ablation_auc": _ablation(x_tr, y_tr, x_va, y_va, feature_names),
        "onnx_max_abs_diff_vs_numpy": onnx_max_diff,
        "training_data": {
            "prompts": len(header.get("prompts", [])),
            "train_prompts": len(np.unique(tr.prompt)),
            "validation_prompts": len(np.unique(va.prompt)),
            "labelled_positions": len(labelled.label),
            "accepted": int((labelled.label == 1).sum()),
            "first_rejections": int((labelled.label == 0).sum()),
            "train_samples": len(y_tr),
            "validation_samples": len(y_va),
            "collection": {k: header.get(k) for k in ("window", "max_tokens", "seed", "committed_tokens", "seconds")},
            "measured_cost_model": header.get("cost_model"),
        },
        "seed": seed,
    }
    out_stem.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    out_stem.with_suffix(".md").write_text(render_card(card))
    card["path"] = str(onnx_path)
    return card


def schedule_card(card_path: str | os.PathLike[str], trace: Trace) -> dict:
    """Adds (or replaces) the delay schedule of a trained predictor's card, from the trace it was
    trained on: the same validation prompts (the card's seed), the exported model's scores. The
    ONNX file is not touched; the card's JSON and Markdown are written again."""
    from edgekit.drafting import OnnxPredictor

    card_path = Path(card_path)
    try:
        card = json.loads(card_path.read_text())
        seed, max_window = int(card.get("seed", 0)), int(card["max_window"])
        operating = (float(card["threshold"]), str(card["stop"]))
        trained_on = card["training_data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{card_path} is not a predictor's metric card: {exc!r}") from exc
    _, val_rows = split_by_prompt(trace, 0.2, seed)
    va = trace.rows(val_rows)
    # the same validation prompts as at training, or the schedule would be tabulated on training prompts
    got = (len(trace.labelled().label), len(va.labelled().label))
    want = (trained_on.get("labelled_positions"), trained_on.get("validation_samples"))
    if got != want:
        raise ConfigError(
            f"these traces are not the ones {card_path.name} was trained on: {got[0]} labelled positions, "
            f"{got[1]} in validation, against its {want[0]} and {want[1]} (give the same files, in the same order)"
        )
    score = OnnxPredictor(card_path.with_suffix(".onnx"), schedule=False).p_accept_batch(va.features)
    card["delay_schedule"] = delay_schedule(va, score, max_window=max_window, operating=operating)
    card.pop("path", None)
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    card_path.with_suffix(".md").write_text(render_card(card))
    return card


def _schedule_lines(card: dict) -> list[str]:
    points = card.get("delay_schedule")
    if not points:
        return []
    sigmas = sorted({p["verify_token_steps"] for p in points})
    rhos = sorted({p["round_steps"] for p in points})
    at = {(p["round_steps"], p["verify_token_steps"]): p for p in points}  # a full grid, as training writes
    lines = [
        "",
        "## Stopping rule by round cost (the delay schedule)",
        "",
        "What the drafting loop uses each round, from what a round costs now in draft steps: its fixed time "
        "(the RTT and the verifier's step; rows) and the verification per block token (columns). Each cell: "
        "the threshold on P(accepted) and the stop rule (b: before, a: after), or a fixed window, then the "
        "replayed goodput over the operating point above. `fixed-k` is a fixed window of k.",
        "",
        "| round, draft steps | " + " | ".join(f"{s:g} per token" for s in sigmas) + " |",
        "|---|" + "---|" * len(sigmas),
    ]
    for rho in rhos:
        cells = []
        for sigma in sigmas:
            p = at.get((rho, sigma))
            if p is None:
                cells.append("-")
                continue
            rule = f"fixed-{p['max_window']}" if p["threshold"] == 0.0 else f"{p['threshold']:.2f} {p['stop'][0]}"
            gain = p.get("gain_over_operating_point")
            cells.append(rule + (f" ({100 * gain:+.1f}%)" if gain is not None else ""))
        lines.append(f"| {rho:g} | " + " | ".join(cells) + " |")
    return lines


def render_card(card: dict) -> str:
    m = card["metrics_validation"]
    td = card["training_data"]
    cm = card["cost_model"]
    lines = [
        f"# Rejection predictor: {card['pair']} ({card['draft']} drafting for {card['target']}, {card['mode']})",
        "",
        f"{card['architecture']}; features {', '.join(card['features'])}; operating threshold "
        f"{card['threshold']:.3f} on P(accepted); a predicted rejection ends the block "
        f"{'without that token' if card['stop'] == 'before' else 'after that token'}; max window {card['max_window']}.",
        "",
        "## Held-out classification (validation prompts, WISP Table 4)",
        "",
        "| model | threshold | accuracy | AUC | recall accepted | specificity | FPR | balanced accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, c in card["candidates"].items():
        x = c["metrics"]
        mark = " (shipped)" if kind == card["model"] else ""
        lines.append(
            f"| {kind}{mark} | {c['threshold']:.3f} | {x['accuracy']:.3f} | {x['auc']:.3f} | "
            f"{x['recall_accepted']:.3f} | "
            f"{x['specificity']:.3f} | {x['false_positive_rate']:.3f} | {x['balanced_accuracy']:.3f} |"
        )
    lines += [
        "",
        f"Confusion of the shipped model: {m['confusion']} over {m['samples']} labelled validation positions.",
        "",
        "## Policies replayed on the validation rounds",
        "",
        f"Cost model: {cm['draft_step_ms']:.2f} ms per draft step (measured), {cm['round_ms']:.1f} ms per round, "
        f"{cm['verify_token_ms']:.1f} ms per verified token. Replay is offline: each traced round is re-cut by "
        "the policy; later rounds are not moved.",
        "",
        "| policy | acceptance | accepted/round | wasted | rounds | target passes/token | goodput tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in card["replay_validation"].items():
        lines.append(
            f"| {name} | {r['acceptance_rate']:.3f} | {r['accepted_per_round']:.2f} | {r['wasted']} | {r['rounds']} | "
            f"{r['target_passes_per_token']:.3f} | {r['goodput_tok_s']:.1f} |"
        )
    lines += _schedule_lines(card)
    lines += [
        "",
        "## Feature ablation (logistic regression, validation AUC)",
        "",
        *[f"- {k}: {v:.4f}" for k, v in card["feature_ablation_auc"].items()],
        "",
        "## Training data",
        "",
        f"{td['prompts']} prompts ({td['train_prompts']} train / {td['validation_prompts']} validation, "
        "split by prompt), "
        f"{td['labelled_positions']} labelled positions ({td['accepted']} accepted, {td['first_rejections']} first "
        f"rejections); collected with a fixed window of {td['collection']['window']}, "
        f"{td['collection']['max_tokens']} tokens per prompt, greedy, seed {td['collection']['seed']}.",
        f"ONNX export reproduces the numpy model to {card['onnx_max_abs_diff_vs_numpy']:.1e}.",
        "",
    ]
    return "\n".join(lines)
