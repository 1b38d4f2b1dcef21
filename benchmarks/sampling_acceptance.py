"""Acceptance under each sampler beside greedy's, on held-out prompts (issue 35 item 6).

Speculative sampling is lossless but accepts less than greedy drafting: a draft
token is kept with probability min(1, p_target/p_draft) instead of when the two
argmaxes agree. This measures by how much, for the samplers people use: plain
temperature 1.0 and 0.7, each truncation (top-k 40, top-p 0.9, min-p 0.05) and the
repetition penalty at T=0.7, and `edgekit chat`'s defaults (cli/chat.py
CHAT_SAMPLING: T 0.7, top-p 0.9, min-p 0.05, repetition penalty 1.1).

For each pair an `EdgeClient` starts the target as an in-process gRPC verifier on
loopback (exact numerics) and loads the draft. Every prompt runs every sampler
with a fixed draft window (drafting "fixed", K=4; K=8 too for greedy and the chat
defaults), in an order rotated per prompt, with a fixed seed per prompt (the same
for every sampler). Raw completion prompts, no chat template.

Reported per (pair, sampler, K): acceptance rate (accepted/drafted, pooled over
prompts), AAL (accepted draft tokens per round, no bonus), committed tokens per
round (AAL + 1) and output tokens per target pass (completion tokens / rounds),
each with a 95% percentile-bootstrap CI over prompts (prompts resampled, the
pooled ratio recomputed), and the paired difference to greedy at the same K
(same prompts resampled together). Also per prompt kind.

    python -m benchmarks sampling_acceptance                          # gemma-270m (20 prompts), qwen-coder (12)
    python -m benchmarks sampling_acceptance --pairs gemma-270m --prompts 4 --max-tokens 32   # smoke run
    python -m benchmarks sampling_acceptance --plot-only              # redraw the PNG from the JSON
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from edgekit import EdgeClient, GenerationConfig, ServerConfig
from edgekit.cli.chat import CHAT_SAMPLING  # the chat command's defaults, as it applies them
from edgekit.models import get_pair

NAME = "sampling_acceptance"


# name -> GenerationConfig overrides; greedy first.
SAMPLERS: dict[str, dict] = {
    "greedy": {"mode": "greedy"},
    "T1.0": {"mode": "sample", "temperature": 1.0},
    "T0.7": {"mode": "sample", "temperature": 0.7},
    "T0.7 top_k40": {"mode": "sample", "temperature": 0.7, "top_k": 40},
    "T0.7 top_p0.9": {"mode": "sample", "temperature": 0.7, "top_p": 0.9},
    "T0.7 min_p0.05": {"mode": "sample", "temperature": 0.7, "min_p": 0.05},
    "T0.7 rep1.1": {"mode": "sample", "temperature": 0.7, "repetition_penalty": 1.1},
    "chat defaults": {"mode": "sample", **CHAT_SAMPLING},
}

# Per-pair prompt counts by default (qwen is ~3x slower per token here).
DEFAULT_PROMPTS = {"gemma-270m": 20, "qwen-coder": 12}


def pick_prompts(prompts: list[dict], n: int) -> list[dict]:
    """The first n prompts taken round-robin over the kinds (file order within a kind), so that
    a subset mixes code, prose, math, lists, other languages and rewrites; all when n >= len."""
    if n <= 0 or n >= len(prompts):
        return list(prompts)
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for p in prompts:
        by_kind[p["kind"]].append(p)
    out: list[dict] = []
    while len(out) < n:
        for kind in list(by_kind):
            if by_kind[kind] and len(out) < n:
                out.append(by_kind[kind].pop(0))
    return out


# -- statistics ------------------------------------------------------------------------


def pooled(rows: list[dict]) -> dict:
    drafted = sum(r["drafted"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    tokens = sum(r["completion_tokens"] for r in rows)
    return {
        "acceptance_rate": C.ratio(accepted, drafted),
        "accepted_length_no_bonus": C.ratio(accepted, rounds),
        "committed_per_round": C.ratio(accepted + rounds, rounds),
        "tokens_per_target_pass": C.ratio(tokens, rounds),
    }


METRICS = ("acceptance_rate", "accepted_length_no_bonus", "committed_per_round", "tokens_per_target_pass")


def _ratio_arrays(rows: list[dict], idx: np.ndarray) -> dict[str, np.ndarray]:
    """Pooled ratios for each bootstrap resample (idx: resamples x prompts)."""
    d = np.array([r["drafted"] for r in rows], float)[idx].sum(1)
    a = np.array([r["accepted"] for r in rows], float)[idx].sum(1)
    n = np.array([r["rounds"] for r in rows], float)[idx].sum(1)
    t = np.array([r["completion_tokens"] for r in rows], float)[idx].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "acceptance_rate": a / d,
            "accepted_length_no_bonus": a / n,
            "committed_per_round": (a + n) / n,
            "tokens_per_target_pass": t / n,
        }


def bootstrap(rows: list[dict], base: list[dict] | None, reps: int, seed: int) -> dict:
    """Point values, 95% percentile CIs over prompts and, with `base` (greedy's rows on the same
    prompts, same order), the paired difference to it with its CI."""
    point = pooled(rows)
    out: dict = {"prompts": len(rows), **point}
    if len(rows) < 2:
        return out
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(rows), size=(reps, len(rows)))
    boot = _ratio_arrays(rows, idx)
    for m in METRICS:
        lo, hi = np.nanpercentile(boot[m], [2.5, 97.5])
        out[f"{m}_ci95"] = [float(lo), float(hi)]
    if base is not None:
        bpoint = pooled(base)
        bboot = _ratio_arrays(base, idx)
        for m in METRICS:
            diff = boot[m] - bboot[m]
            lo, hi = np.nanpercentile(diff, [2.5, 97.5])
            out[f"{m}_minus_greedy"] = point[m] - bpoint[m]
            out[f"{m}_minus_greedy_ci95"] = [float(lo), float(hi)]
        out["acceptance_rate_relative_to_greedy"] = C.ratio(point["acceptance_rate"], bpoint["acceptance_rate"])
    return out


# -- the run ---------------------------------------------------------------------------


def run_pair(
    pair: str, prompts: list[dict], methods: list[tuple[str, int]], max_tokens: int,
    threads: int | None, seed: int, checkpoint=None,  # type: ignore[no-untyped-def]
) -> dict:
    spec = get_pair(pair)
    t0 = time.perf_counter()
    client = EdgeClient(
        None,
        pair=pair,
        generation=GenerationConfig(max_tokens=max_tokens, draft_k=4, mode="greedy", drafting="fixed"),
        local_server=ServerConfig(
            port=0, max_sessions=2, max_context=4096,
            max_block=max(32, max(k for _, k in methods)), threads=threads,
        ),
    )
    try:
        info = client.server_info()
        load_s = time.perf_counter() - t0
        # Warm-up (not recorded): first calls pay page faults of the mmapped weights.
        client.generate("Hello", max_tokens=8).until_done()
        client.generate("Hello", max_tokens=8, mode="sample", temperature=0.7, seed=0).until_done()

        meta = {
            "pair": pair,
            "draft": spec.draft,
            "target": spec.target,
            "server_info": {
                "target_model": info.target_model,
                "exact_numerics": info.exact_numerics,
                "max_block": info.max_block,
            },
            "max_tokens": max_tokens,
            "methods": [f"{s} K={k}" for s, k in methods],
            "load_s": load_s,
            "prompt_ids": [p["id"] for p in prompts],
        }
        rows: list[dict] = []
        t_start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            order = methods[i % len(methods):] + methods[: i % len(methods)]
            prompt_seed = seed + i
            line = []
            for name, k in order:
                final = client.generate(
                    prompt["prompt"], draft_k=k, drafting="fixed", max_tokens=max_tokens,
                    seed=prompt_seed, **SAMPLERS[name],
                ).until_done()
                d = final.stats.to_dict()
                rows.append({
                    "id": prompt["id"],
                    "kind": prompt["kind"],
                    "sampler": name,
                    "k": k,
                    "seed": prompt_seed,
                    "sampler_settings": d.get("sampler"),
                    "prompt_tokens": d["prompt_tokens"],
                    "completion_tokens": d["completion_tokens"],
                    "finish_reason": d["finish_reason"],
                    "drafted": d["drafted"],
                    "accepted": d["accepted"],
                    "rounds": d["rounds"],
                    "acceptance_rate": d["acceptance_rate"],
                    "accepted_length_no_bonus": d["accepted_length"],
                    "committed_per_round": d["committed_per_round"],
                    "plain_rounds": d.get("plain_rounds", 0),
                    "elapsed_s": d["elapsed_s"],
                    "text": final.text[:200],
                })
                line.append(f"{name}/K{k}:{d['acceptance_rate']:.2f}")
            elapsed = time.perf_counter() - t_start
            C.progress(f"  {pair} [{i + 1}/{len(prompts)}] {prompt['id']} ({elapsed / 60:.1f} min): "
                       + " ".join(sorted(line)))
            if checkpoint is not None:
                meta["wall_s"] = elapsed
                checkpoint(summarize(meta, rows, methods, seed, complete=i + 1 == len(prompts)))
        meta["wall_s"] = time.perf_counter() - t_start
        return summarize(meta, rows, methods, seed, complete=True)
    finally:
        client.close()


def summarize(meta: dict, rows: list[dict], methods: list[tuple[str, int]], seed: int, complete: bool) -> dict:
    """The pair's aggregates over the prompts done so far."""
    aggregates: dict = {}
    by_kind: dict = {}
    for name, k in methods:
        key = f"{name} K={k}"
        mine = [r for r in rows if r["sampler"] == name and r["k"] == k]
        if not mine:
            continue
        base = [r for r in rows if r["sampler"] == "greedy" and r["k"] == k]
        base = base if (name != "greedy" and [r["id"] for r in base] == [r["id"] for r in mine]) else None
        aggregates[key] = {"sampler": name, "k": k, "settings": SAMPLERS[name],
                           **bootstrap(mine, base, 2000, seed)}
        aggregates[key]["eos_endings"] = sum(r["finish_reason"] not in ("length", "max_tokens") for r in mine)
        aggregates[key]["acceptance_rate_mean_of_prompts"] = float(np.mean([r["acceptance_rate"] for r in mine]))
        kinds: dict[str, list[dict]] = defaultdict(list)
        for r in mine:
            kinds[r["kind"]].append(r)
        by_kind[key] = {kind: {"prompts": len(rs), **pooled(rs)} for kind, rs in sorted(kinds.items())}
    done = list(dict.fromkeys(r["id"] for r in rows))
    return {
        **meta,
        "complete": complete,
        "prompts_done": len(done),
        "prompt_ids_done": done,
        "aggregates": aggregates,
        "by_kind": by_kind,
        "rows": rows,
    }


def main() -> None:
    parser = C.arguments(__doc__, threads=1, pairs="gemma-270m,qwen-coder", max_tokens=96, out=NAME)
    parser.add_argument("--prompts", default="",
                        help="prompts per pair: N for every pair, or pair=N,pair=N "
                             "(default gemma-270m=20,qwen-coder=12; a subset is taken round-robin over kinds)")
    parser.add_argument("--prompt-set", default="eval")
    parser.add_argument("--samplers", default=",".join(SAMPLERS), help="at K=4 (names as in SAMPLERS)")
    parser.add_argument("--k8", default="greedy,chat defaults", help="samplers also run at K=8 ('' for none)")
    parser.add_argument("--seed", type=int, default=1, help="prompt i is sampled with seed SEED+i")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--merge", action="store_true",
                        help="keep the results of pairs not run now from the existing JSON")
    parser.add_argument("--note", action="append", default=[], help="a note for the JSON (repeatable)")
    args = C.parse(parser, machine=False)  # the machine is printed below, when something is measured
    path = C.RESULTS_DIR / f"{args.out}.json"
    if args.plot_only:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return
    threads = args.threads if args.threads > 0 else None  # None: edgekit's default
    C.print_machine()
    counts = dict(DEFAULT_PROMPTS)
    if args.prompts:
        if "=" in args.prompts:
            counts.update({p: int(n) for p, n in (x.split("=") for x in C.csv_list(args.prompts))})
        else:
            counts = {p: int(args.prompts) for p in C.csv_list(args.pairs)}
    all_prompts = C.load_prompts(args.prompt_set)
    samplers = C.csv_list(args.samplers)
    unknown = [s for s in samplers + C.csv_list(args.k8) if s not in SAMPLERS]
    if unknown:
        raise SystemExit(f"unknown samplers {unknown}; known: {list(SAMPLERS)}")
    methods = [(s, 4) for s in samplers] + [(s, 8) for s in C.csv_list(args.k8)]
    pairs = C.csv_list(args.pairs)
    # --merge: keep the other pairs' results (and commands) of an earlier run in the same JSON.
    kept: list[dict] = []
    earlier_commands: list[str] = []
    if args.merge and path.exists():
        old = json.loads(path.read_text())
        kept = [r for r in old["results"] if r["pair"] not in pairs]
        earlier_commands = old.get("earlier_commands", []) + [old["command"]]
    results: list[dict] = []
    t0 = time.perf_counter()

    def write(current: dict | None = None) -> Path:
        done = results + ([current] if current is not None else [])
        order = {p: i for i, p in enumerate(DEFAULT_PROMPTS)}
        payload = {
            "settings": {
                "pairs": sorted({r["pair"] for r in kept + done}, key=lambda p: order.get(p, 99)),
                "prompt_set": args.prompt_set, "max_tokens": args.max_tokens,
                "drafting": "fixed", "methods": [f"{s} K={k}" for s, k in methods], "samplers": SAMPLERS,
                "seed": args.seed, "threads": args.threads,
                "bootstrap": "2000 resamples of prompts, 95% percentile",
                "prompt_subset": "round-robin over kinds in file order when fewer than all prompts",
                "numerics": "exact",
            },
            "earlier_commands": earlier_commands,
            "wall_min": (time.perf_counter() - t0) / 60,
            "notes": args.note,
            "results": sorted(kept + done, key=lambda r: order.get(r["pair"], 99)),
        }
        return C.write_result(args.out, payload)

    for pair in pairs:
        prompts = pick_prompts(all_prompts, counts.get(pair, 20))
        C.progress(f"{pair}: {len(prompts)} prompts x {len(methods)} methods, max {args.max_tokens} tokens")
        results.append(run_pair(pair, prompts, methods, args.max_tokens, threads, args.seed, checkpoint=write))
    out = write()
    payload = json.loads(out.read_text())
    print_table(payload)
    plot(json.loads(out.read_text()), out.with_suffix(".png"))
    print(out)


def _ci(a: dict, m: str, digits: int = 2) -> str:
    ci = a.get(f"{m}_ci95")
    v = C.fmt(a[m], digits)
    return f"{v} [{C.fmt(ci[0], digits)}, {C.fmt(ci[1], digits)}]" if ci else v


def print_table(payload: dict) -> None:
    rows = []
    for r in payload["results"]:
        for a in r["aggregates"].values():
            diff = a.get("acceptance_rate_minus_greedy")
            dci = a.get("acceptance_rate_minus_greedy_ci95")
            rows.append([
                r["pair"], a["sampler"], a["k"], a["prompts"], _ci(a, "acceptance_rate"),
                (f"{diff:+.2f} [{dci[0]:+.2f}, {dci[1]:+.2f}]" if diff is not None else "-"),
                _ci(a, "accepted_length_no_bonus"), _ci(a, "committed_per_round"),
                _ci(a, "tokens_per_target_pass"), a["eos_endings"],
            ])
    print(C.table(["pair", "sampler", "K", "prompts", "acceptance [95% CI]", "minus greedy [CI]",
                   "AAL [CI]", "committed/round [CI]", "tokens/target pass [CI]", "EOS"], rows))


def plot(payload: dict, path: Path) -> None:
    """Per pair: acceptance rate per sampler (K=4 bars, K=8 beside where run), 95% CI whiskers."""
    results = payload["results"]
    fig, axes = C.subplots(1, nrows=len(results), width=11.0, height=4.4)
    for ax, r in zip(axes, results, strict=True):
        aggs = list(r["aggregates"].values())
        names = list(dict.fromkeys(a["sampler"] for a in aggs))
        x = np.arange(len(names))
        ks = sorted({a["k"] for a in aggs})
        width = 0.8 / len(ks)
        colors = {4: "#4477aa", 8: "#ee8866"}
        for k in ks:
            xs, ys, lo, hi = [], [], [], []
            for i, n in enumerate(names):
                a = next((a for a in aggs if a["sampler"] == n and a["k"] == k), None)
                if a is None:
                    continue
                ci = a.get("acceptance_rate_ci95", [a["acceptance_rate"]] * 2)
                here = sorted(b["k"] for b in aggs if b["sampler"] == n)  # a lone K is centred
                xs.append(x[i] + (here.index(k) - (len(here) - 1) / 2) * width)
                ys.append(a["acceptance_rate"])
                lo.append(a["acceptance_rate"] - ci[0])
                hi.append(ci[1] - a["acceptance_rate"])
            bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, color=colors.get(k, "#999"),
                          label=f"K={k}", error_kw={"elinewidth": 1})
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2, label_type="center", color="white")
        g4 = r["aggregates"].get("greedy K=4")
        if g4:
            ax.axhline(g4["acceptance_rate"], color="#4477aa", ls=":", lw=1, label="greedy K=4")
        ax.set_xticks(x, [n.replace(" ", "\n", 1) for n in names], fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("acceptance rate (accepted / drafted)")
        n_prompts = next(iter(r["aggregates"].values()))["prompts"]
        ax.set_title(f"{r['pair']}: acceptance per sampler (fixed window K), {n_prompts} held-out prompts, "
                     f"max {r.get('max_tokens', payload['settings']['max_tokens'])} tokens; "
                     "whiskers: 95% bootstrap CI over prompts", fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
