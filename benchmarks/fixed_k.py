"""Fixed draft window K: acceptance, accepted length, rounds and speed per pair.

For each pair an `EdgeClient` starts the pair's target as an in-process gRPC
verifier on loopback (exact numerics) and loads the draft. For every prompt of
the evaluation set, in one pass, it runs the target-only baseline (the
verifier's Generate RPC: the target decodes every token) and greedy
speculative decoding at each K, in a rotating order so that the noise of the
shared CPU hits every method alike. Speculative vs target-only speed is
therefore a ratio measured side by side.

Greedy speculative decoding is lossless: its token ids must equal the
target-only ids. The benchmark counts the prompts where they do, per K.

    python -m benchmarks fixed_k                                  # both pairs, K=2,4,8, all prompts
    python -m benchmarks fixed_k --pairs gemma-270m --k 4 --limit 4 --max-tokens 64
"""

from __future__ import annotations

import time
from collections import defaultdict

from benchmarks import harness as C
from edgekit import EdgeClient, GenerationConfig, ServerConfig
from edgekit.models import get_pair

ALL_PAIRS = ("gemma-270m", "qwen-coder")


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def spec_row(prompt: dict, k: int, final, baseline) -> dict:  # type: ignore[no-untyped-def]
    s = final.stats
    d = s.to_dict()
    div = first_divergence(final.token_ids, baseline.token_ids)
    return {
        "id": prompt["id"],
        "kind": prompt["kind"],
        "k": k,
        "prompt_tokens": d["prompt_tokens"],
        "completion_tokens": d["completion_tokens"],
        "finish_reason": d["finish_reason"],
        "drafted": d["drafted"],
        "accepted": d["accepted"],
        "acceptance_rate": d["acceptance_rate"],
        "accepted_length_no_bonus": d["accepted_length"],
        "committed_per_round": d["committed_per_round"],
        "rounds": d["rounds"],
        "wasted_draft_tokens": d["wasted_draft_tokens"],
        "target_passes_per_token": d["target_passes_per_token"],
        "tokens_per_second": d["tokens_per_second"],
        "elapsed_s": d["elapsed_s"],
        "prefill_ms": d["prefill_ms"],
        "time_to_first_token_ms": d["time_to_first_token_ms"],
        "draft_ms": d["draft_ms"],
        "draft_ms_per_token": d["draft_ms_per_token"],
        "server_verify_ms": d["server"]["verify_ms"],
        "round_trip_ms": d["round_trip_ms"],
        "verify_ms_per_round": C.ratio(d["server"]["verify_ms"], d["rounds"]),
        "round_trip_ms_per_round": C.ratio(d["round_trip_ms"], d["rounds"]),
        "speedup_vs_target_only": C.ratio(
            d["tokens_per_second"], baseline.stats.tokens_per_second
        ),
        "identical_to_target_only": final.token_ids == baseline.token_ids,
        "first_divergence": div,
        "text": final.text if final.token_ids != baseline.token_ids else None,
    }


def aggregate(rows: list[dict], baseline_rows: list[dict]) -> dict:
    """Totals over prompts, and ratios of totals (micro averages) beside per-prompt means."""
    def tot(key: str) -> float:
        return sum(r[key] for r in rows)

    drafted, accepted, rounds, tokens = (
        tot("drafted"),
        tot("accepted"),
        tot("rounds"),
        tot("completion_tokens"),
    )
    wdt, elapsed = tot("wasted_draft_tokens"), tot("elapsed_s")
    base_tokens = sum(r["completion_tokens"] for r in baseline_rows)
    base_elapsed = sum(r["elapsed_s"] for r in baseline_rows)
    spec_tps = C.ratio(tokens, elapsed)
    base_tps = C.ratio(base_tokens, base_elapsed)
    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    return {
        "prompts": len(rows),
        "total_drafted": drafted,
        "total_accepted": accepted,
        "total_rounds": rounds,
        "total_completion_tokens": tokens,
        "total_wasted_draft_tokens": wdt,
        "acceptance_rate": C.ratio(accepted, drafted),
        "acceptance_rate_mean_of_prompts": mean("acceptance_rate"),
        "accepted_length_no_bonus": C.ratio(accepted, rounds),
        "committed_per_round": C.ratio(accepted + rounds, rounds),
        "tokens_per_round": C.ratio(tokens, rounds),
        "rounds_mean_per_prompt": rounds / len(rows),
        "target_passes_per_token": C.ratio(rounds, tokens),
        "wasted_draft_tokens_per_round": C.ratio(wdt, rounds),
        "wasted_draft_tokens_mean_per_prompt": wdt / len(rows),
        "tokens_per_second": spec_tps,
        "tokens_per_second_mean_of_prompts": mean("tokens_per_second"),
        "draft_ms_per_token": C.ratio(tot("draft_ms"), drafted),
        "verify_ms_per_round": C.ratio(tot("server_verify_ms"), rounds),
        "round_trip_ms_per_round": C.ratio(tot("round_trip_ms"), rounds),
        "time_to_first_token_ms_median": C.median(
            [r["time_to_first_token_ms"] for r in rows]
        ),
        "target_only_tokens_per_second": base_tps,
        "speedup_vs_target_only": C.ratio(spec_tps, base_tps),
        "speedup_vs_target_only_median_of_prompts": C.median(
            [r["speedup_vs_target_only"] for r in rows]
        ),
        "identical_to_target_only": sum(r["identical_to_target_only"] for r in rows),
    }


def run_pair(
    pair: str, prompts: list[dict], ks: list[int], max_tokens: int, threads: int | None
) -> dict:
    spec = get_pair(pair)
    t0 = time.perf_counter()
    client = EdgeClient(
        None,
        pair=pair,
        generation=GenerationConfig(
            max_tokens=max_tokens, draft_k=ks[0], mode="greedy", drafting="fixed"
        ),
        local_server=ServerConfig(
            port=0,
            max_sessions=2,
            max_context=4096,
            max_block=max(32, max(ks)),
            threads=threads,
        ),
    )
    try:
        info = client.server_info()
        load_s = time.perf_counter() - t0
        # Warm-up (not recorded): first calls pay page faults of the mmapped weights.
        client.generate_target_only("Hello", max_tokens=8).until_done()
        client.generate("Hello", draft_k=ks[0], max_tokens=8).until_done()

        baseline_rows: list[dict] = []
        spec_rows: list[dict] = []
        methods = ["target-only"] + [f"k{k}" for k in ks]
        for i, prompt in enumerate(prompts):
            # Rotate the order so no method always runs first (or last) on a prompt.
            order = methods[i % len(methods) :] + methods[: i % len(methods)]
            finals = {}
            for m in order:
                if m == "target-only":
                    finals[m] = client.generate_target_only(
                        prompt["prompt"]
                    ).until_done()
                else:
                    finals[m] = client.generate(
                        prompt["prompt"], draft_k=int(m[1:])
                    ).until_done()
            base = finals["target-only"]
            bd = base.stats.to_dict()
            baseline_rows.append(
                {
                    "id": prompt["id"],
                    "kind": prompt["kind"],
                    "prompt_tokens": bd["prompt_tokens"],
                    "completion_tokens": bd["completion_tokens"],
                    "finish_reason": bd["finish_reason"],
                    "tokens_per_second": bd["tokens_per_second"],
                    "elapsed_s": bd["elapsed_s"],
                    "time_to_first_token_ms": bd["time_to_first_token_ms"],
                    "server_decode_ms_per_token": C.ratio(
                        bd["server"]["verify_ms"], bd["completion_tokens"]
                    ),
                    "text": base.text,
                    "token_ids": list(base.token_ids),
                }
            )
            for k in ks:
                spec_rows.append(spec_row(prompt, k, finals[f"k{k}"], base))
            accs = " ".join(
                f"K={k}:{spec_rows[-len(ks) + j]['acceptance_rate']:.2f}"
                for j, k in enumerate(ks)
            )
            print(
                f"  {pair} [{i + 1}/{len(prompts)}] {prompt['id']}: {accs}", flush=True
            )

        aggregates = {}
        by_kind = {}
        for k in ks:
            rows = [r for r in spec_rows if r["k"] == k]
            aggregates[str(k)] = aggregate(rows, baseline_rows)
            kinds = defaultdict(list)
            for r in rows:
                kinds[r["kind"]].append(r)
            by_kind[str(k)] = {
                kind: {
                    "prompts": len(rs),
                    "acceptance_rate": C.ratio(
                        sum(r["accepted"] for r in rs), sum(r["drafted"] for r in rs)
                    ),
                    "accepted_length_no_bonus": C.ratio(
                        sum(r["accepted"] for r in rs), sum(r["rounds"] for r in rs)
                    ),
                    "target_passes_per_token": C.ratio(
                        sum(r["rounds"] for r in rs),
                        sum(r["completion_tokens"] for r in rs),
                    ),
                }
                for kind, rs in sorted(kinds.items())
            }
        return {
            "pair": pair,
            "draft": spec.draft,
            "target": spec.target,
            "server_info": {
                "target_model": info.target_model,
                "exact_numerics": info.exact_numerics,
                "invariant_batch": info.invariant_batch,
                "max_block": info.max_block,
                "max_context": info.max_context,
            },
            "load_s": load_s,
            "target_only": {
                "tokens_per_second": C.ratio(
                    sum(r["completion_tokens"] for r in baseline_rows),
                    sum(r["elapsed_s"] for r in baseline_rows),
                ),
                "total_completion_tokens": sum(
                    r["completion_tokens"] for r in baseline_rows
                ),
                "rows": baseline_rows,
            },
            "aggregates": aggregates,
            "by_kind": by_kind,
            "rows": spec_rows,
        }
    finally:
        client.close()


def main() -> None:
    # --pairs and --prompts are the script's own: pairs may be 'all', prompts names a prompt set (not a count).
    ap = C.arguments(__doc__, whole_doc=True, threads=1, max_tokens=128, out="fixed_k")
    ap.add_argument(
        "--pairs",
        default=",".join(ALL_PAIRS),
        help="comma-separated pairs, or 'all' (default both)",
    )
    ap.add_argument("--k", default="2,4,8", help="draft windows (default 2,4,8)")
    ap.add_argument(
        "--prompts",
        default="eval",
        help="prompt set: benchmarks/prompts/<name>.jsonl or a path",
    )
    ap.add_argument("--limit", type=int, help="first N prompts only")
    args = C.parse(ap)

    pairs = list(ALL_PAIRS) if args.pairs == "all" else C.csv_list(args.pairs)
    ks = C.csv_list(args.k, int)
    prompts = C.load_prompts(args.prompts, args.limit)
    threads = args.threads or None
    print(
        f"pairs {pairs}, K {ks}, {len(prompts)} prompts, max_tokens {args.max_tokens}, greedy",
        flush=True,
    )

    started = time.perf_counter()
    results = []
    for pair in pairs:
        t = time.perf_counter()
        results.append(run_pair(pair, prompts, ks, args.max_tokens, threads))
        results[-1]["wall_s"] = time.perf_counter() - t

    headers = [
        "pair", "K", "acceptance", "AAL (no bonus)", "tokens/round", "rounds", "passes/token",
        "WDT", "WDT/round", "tok/s", "target-only tok/s", "spec/target-only speed",
        "draft ms/tok", "verify ms/round", "identical",
    ]  # fmt: skip
    rows = []
    for res in results:
        for k in ks:
            a = res["aggregates"][str(k)]
            rows.append(
                [
                    res["pair"], k, a["acceptance_rate"], a["accepted_length_no_bonus"], a["committed_per_round"],
                    a["total_rounds"], a["target_passes_per_token"], a["total_wasted_draft_tokens"],
                    a["wasted_draft_tokens_per_round"], a["tokens_per_second"], a["target_only_tokens_per_second"],
                    a["speedup_vs_target_only"], a["draft_ms_per_token"], a["verify_ms_per_round"],
                    f"{a['identical_to_target_only']}/{a['prompts']}",
                ]
            )  # fmt: skip
    print(C.table(headers, rows))
    kind_rows = []
    for res in results:
        for k in ks:
            for kind, v in res["by_kind"][str(k)].items():
                kind_rows.append(
                    [
                        res["pair"],
                        k,
                        kind,
                        v["prompts"],
                        v["acceptance_rate"],
                        v["accepted_length_no_bonus"],
                    ]
                )
    print(
        C.table(
            ["pair", "K", "kind", "prompts", "acceptance", "AAL (no bonus)"], kind_rows
        )
    )
    path = C.write_result(
        args.out,
        {
            "settings": {
                "pairs": pairs,
                "k": ks,
                "prompts": args.prompts,
                "prompt_ids": [p["id"] for p in prompts],
                "limit": args.limit,
                "max_tokens": args.max_tokens,
                "mode": "greedy",
                "verifier": (
                    "in-process gRPC on loopback, exact numerics, "
                    "ServerConfig(max_sessions=2, max_context=4096)"
                ),
                "threads": threads or "edgekit default (all cores)",
            },
            "definitions": {
                "acceptance_rate": "accepted / drafted, over all prompts",
                "accepted_length_no_bonus": "AAL: accepted draft tokens per round, WITHOUT the bonus/correction token",
                "committed_per_round": "AAL + 1: tokens per round with the verifier's bonus/correction token",
                "target_passes_per_token": "rounds / committed tokens (prefill not counted)",
                "wasted_draft_tokens": "WDT: drafted - accepted",
                "tokens_per_second": (
                    "committed tokens / wall time incl. session open (both prefills), summed over prompts"
                ),
                "target_only_tokens_per_second": "verifier Generate RPC, same prompts, same run",
                "speedup_vs_target_only": "speculative tok/s / target-only tok/s (same run, interleaved per prompt)",
                "identical_to_target_only": "prompts whose greedy speculative token ids equal the target-only ids",
            },
            "results": results,
            "wall_s": time.perf_counter() - started,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
