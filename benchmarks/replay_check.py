"""Cross-check of fixed_k.py: replays its greedy runs from the draft model alone.

Greedy speculative output equals the target-only output (fixed_k.py checks
this), so every round is determined by one fact per position i of the
target-only continuation: does the draft's argmax, given the committed prefix,
equal the target's token there? This script computes that match vector with
the draft alone (teacher forcing, one token at a time, as the session drafts),
replays the fixed-window rounds from it, and compares drafted / accepted /
rounds with what fixed_k.py recorded through the real client and verifier.
Accepted tokens and rounds must agree exactly; drafted may differ where the
draft proposed an end-of-generation token after its first mismatch in a block
(the replay cannot know what it drafts there; it assumes a full block).
It also reports the match rate itself: the draft/target agreement per token,
independent of K (the acceptance a K=1 window would see).

    python -m benchmarks fixed_k ...          # writes results/fixed_k.json
    python -m benchmarks replay_check         # reads it, writes results/replay_check.json
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from edgekit import LlamaDraftModel
from edgekit.models import get_pair, model_path


def match_vector(
    draft: LlamaDraftModel, prompt: list[int], cont: list[int]
) -> tuple[list[bool], list[int]]:
    """Per position of `cont`: the draft's greedy token given prompt + cont[:i], and whether it matches."""
    draft.truncate(0)
    draft.prefill(prompt[:-1])
    out = draft.eval([prompt[-1]])
    proposals = []
    for tok in cont:
        proposals.append(int(np.argmax(out.logits)))
        out = draft.eval([tok])
    return [p == t for p, t in zip(proposals, cont)], proposals


def replay(
    match: list[bool], proposals: list[int], is_eog, k: int, max_tokens: int
) -> dict:  # type: ignore[no-untyped-def]
    """Fixed-window rounds over a known continuation, as SpeculativeSession runs them.

    Unknowable: what the draft proposes after its first mismatch in a block;
    an end-of-generation token there would shorten the block. Assumed absent."""
    n = len(match)
    i = drafted = accepted = rounds = 0
    while i < n:
        limit = max(1, min(k, max_tokens - i - 1))
        a = 0
        block = limit
        while a < limit and i + a < n and match[i + a]:
            a += 1
            if is_eog(proposals[i + a - 1]):
                block = a  # the draft stops at an end-of-generation token
                break
        else:
            if (
                i + a < n
                and not match[i + a]
                and a < limit
                and is_eog(proposals[i + a])
            ):
                block = a + 1
        drafted += block
        accepted += a
        rounds += 1
        i += a + 1
    return {"drafted": drafted, "accepted": accepted, "rounds": rounds}


def main() -> None:
    ap = C.arguments(__doc__, whole_doc=True, threads=1, out="replay_check")
    ap.add_argument("--input", default=str(C.RESULTS_DIR / "fixed_k.json"))
    args = C.parse(ap)
    data = json.loads(Path(args.input).read_text())
    settings = data["settings"]
    prompts = {p["id"]: p for p in C.load_prompts(settings["prompts"])}
    max_tokens = settings["max_tokens"]

    results = []
    table_rows = []
    for res in data["results"]:
        pair = res["pair"]
        draft = LlamaDraftModel(
            model_path(get_pair(pair).draft), name=get_pair(pair).draft
        )
        per_prompt = []
        agree: dict[int, int] = defaultdict(int)
        agree_drafted: dict[int, int] = defaultdict(int)
        for base in res["target_only"]["rows"]:
            prompt_ids = draft.tokenize(prompts[base["id"]]["prompt"])
            cont = base["token_ids"]
            match, proposals = match_vector(draft, prompt_ids, cont)
            row = {
                "id": base["id"],
                "kind": base["kind"],
                "tokens": len(cont),
                "match_rate": float(np.mean(match)),
            }
            for k in settings["k"]:
                sim = replay(match, proposals, draft.is_eog, k, max_tokens)
                obs = next(
                    r for r in res["rows"] if r["id"] == base["id"] and r["k"] == k
                )
                same = (
                    sim["accepted"] == obs["accepted"]
                    and sim["rounds"] == obs["rounds"]
                )
                agree[k] += int(same)
                agree_drafted[k] += int(same and sim["drafted"] == obs["drafted"])
                row[f"k{k}"] = {
                    "replay": sim,
                    "observed": {f: obs[f] for f in sim},
                    "accepted_and_rounds_same": same,
                    "drafted_same": sim["drafted"] == obs["drafted"],
                }
            per_prompt.append(row)
            print(f"  {pair} {base['id']}: match {row['match_rate']:.2f}", flush=True)
        draft.close()
        total_match = sum(r["match_rate"] * r["tokens"] for r in per_prompt) / sum(
            r["tokens"] for r in per_prompt
        )
        by_kind: dict[str, list] = defaultdict(list)
        for r in per_prompt:
            by_kind[r["kind"]].append(r)
        kind_match = {
            kind: sum(r["match_rate"] * r["tokens"] for r in rs)
            / sum(r["tokens"] for r in rs)
            for kind, rs in sorted(by_kind.items())
        }
        results.append(
            {
                "pair": pair,
                "match_rate": total_match,
                "match_rate_by_kind": kind_match,
                "replay_agrees_accepted_and_rounds": {
                    str(k): agree[k] for k in settings["k"]
                },
                "replay_agrees_also_drafted": {
                    str(k): agree_drafted[k] for k in settings["k"]
                },
                "prompts": len(per_prompt),
                "rows": per_prompt,
            }
        )
        table_rows.append(
            [pair, total_match, " ".join(f"{k}:{v:.2f}" for k, v in kind_match.items())]
            + [
                f"{agree[k]}/{len(per_prompt)} ({agree_drafted[k]})"
                for k in settings["k"]
            ]
        )
    print(
        C.table(
            ["pair", "draft/target match per token", "by kind"]
            + [f"replay = run, K={k} (drafted too)" for k in settings["k"]],
            table_rows,
        )
    )
    path = C.write_result(
        args.out,
        {
            "input": args.input,
            "settings": settings,
            "notes": "match_rate: fraction of target-only tokens the draft predicts given the committed prefix "
            "(teacher forcing). Replay: accepted and rounds must agree; drafted can differ only via an "
            "end-of-generation proposal after a mismatch.",
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
