"""What a sampling row costs the host when a drafted token is accepted: the whole distribution, or `Sampler.accepts`.

Speculative sampling asks, at each drafted position, whether u q(x) < p(x) under the target's
sampler; only where the block stops does it need the whole distribution (the residual to draw
from). Before, the rules computed `Sampler.probs` (a float64 softmax over the whole vocabulary)
at every position; now `Sampler.accepts` bounds the softmax's normaliser with a float32 sum and
decides by the bound, falling back to `probs` where the threshold lies within it (with top-p, also
where the bound leaves the nucleus's edge in doubt, or its candidates are too many). This times
both on the same rows, for samplers that keep the whole row, cut it by value or take a nucleus,
and counts the decisions that fell back; every decision is checked to be the same both ways.

The device pays for the same rows when it drafts: each drafted token's distribution is uploaded cut
to its `draft_top_k` (32) likeliest tokens (`draft_distribution`), which now takes the softmax of
the tokens the cut keeps (`Sampler.support`) where it took `probs` over the whole row: timed too,
beside `probs`, the whole row's cost it no longer pays.

The rows are the target's own: its logits along a text, decoded one token at a time (no batch
effects). Token x is drawn from each row's distribution (what a drafted token that may be accepted
looks like) and u q(x) is a uniform draw times 1.25 p(x), so about four in five are accepted.

    python -m benchmarks sampling_rows                           # gemma-270m (262,144 logits a row)
    python -m benchmarks sampling_rows --pair qwen-coder --out sampling_rows_qwen
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C
from edgekit import Sampler
from edgekit.models import pair_paths
from edgekit.protocol import draft_distribution
from edgekit.runtime import LlamaContext, LlamaModel

TEXT = ("The verifier checks the blocks many devices draft. Each block is a few tokens the device "
        "guessed; the target accepts them up to the first it would not have said, then adds its own. "
        "def mean(xs):\n    return sum(xs) / len(xs)\n")

DRAFT_TOP_K = 32  # ClientConfig.draft_top_k's default

SAMPLERS = {
    "temperature 0.8": Sampler(temperature=0.8),
    "temperature 1": Sampler(),
    "min-p 0.05": Sampler(temperature=0.8, min_p=0.05),
    "penalties and bias": Sampler(temperature=0.8, repetition_penalty=1.2, presence_penalty=0.3,
                                  logit_bias={10: 2.0}),
    "top-p 0.9": Sampler(temperature=0.8, top_p=0.9),
    "top-p 0.95, temperature 1": Sampler(top_p=0.95),
    "the chat's defaults": Sampler(temperature=0.7, top_p=0.9, min_p=0.05, repetition_penalty=1.1),
}


def target_rows(pair: str, n_rows: int, threads: int | None) -> tuple[np.ndarray, list[int]]:
    """The target's logits after each of the text's first `n_rows` tokens (past the first), one decode each."""
    _, path = pair_paths(pair)
    model = LlamaModel(str(path))
    ctx = LlamaContext(model, n_ctx=512, n_threads=threads)
    try:
        tokens = model.tokenize(TEXT)[: n_rows + 1]
        rows = []
        for pos, tok in enumerate(tokens[:-1]):
            ctx.decode_sequence([tok], pos)
            rows.append(ctx.logits(-1).copy())
        return np.stack(rows), tokens
    finally:
        ctx.close()
        model.close()


def measure(rows: np.ndarray, tokens: list[int], repeats: int) -> list[dict[str, Any]]:
    out = []
    rng = np.random.default_rng(0)
    for name, sampler in SAMPLERS.items():
        asks = []
        for j, row in enumerate(rows):
            context = tokens[: j + 1]
            p = sampler.probs(row, context)
            x = int(rng.choice(p.size, p=p))
            asks.append((row, x, float(rng.random()) * 1.25 * float(p[x]), context, float(p[x])))
        whole_ms, bounded_ms = [], []
        for r in range(repeats):
            for way in (("whole", "bounded") if r % 2 else ("bounded", "whole")):  # interleaved
                t0 = time.perf_counter()
                if way == "whole":
                    got = [t < float(sampler.probs(row, ctx)[x]) for row, x, t, ctx, _ in asks]
                else:
                    got = [sampler.accepts(row, x, t, ctx) for row, x, t, ctx, _ in asks]
                ms = (time.perf_counter() - t0) * 1e3 / len(asks)
                (whole_ms if way == "whole" else bounded_ms).append(ms)
                assert got == [t < px for _, _, t, _, px in asks], (name, way)
        drafted_ms = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for row, _, _, ctx, _ in asks:
                draft_distribution(row, sampler, DRAFT_TOP_K, ctx)
            drafted_ms.append((time.perf_counter() - t0) * 1e3 / len(asks))
        whole, bounded = C.median(whole_ms), C.median(bounded_ms)
        out.append({"sampler": name, "settings": sampler.describe(), "rows": len(asks),
                    "accepted": sum(t < px for _, _, t, _, px in asks), "whole_ms_per_row": whole,
                    "accepts_ms_per_row": bounded, "whole_over_accepts": C.ratio(whole, bounded),
                    "took_probs": probs_taken(sampler, asks), "draft_distribution_ms_per_row": C.median(drafted_ms)})
    return out


def probs_taken(sampler: Sampler, asks: list[tuple[Any, ...]]) -> int:
    """How many of `asks` `Sampler.accepts` could not decide by its bound (it called `probs`)."""
    spec = Sampler.probs
    calls = 0

    def counted(self, logits, context=()):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return spec(self, logits, context)

    Sampler.probs = counted  # type: ignore[method-assign]
    try:
        for row, x, t, ctx, _ in asks:
            sampler.accepts(row, x, t, ctx)
    finally:
        Sampler.probs = spec  # type: ignore[method-assign]
    return calls


def plot(result: dict[str, Any], png: Path) -> None:
    fig, (ax,) = C.subplots(width=7.5, height=4.8)
    rows = result["results"]
    ys = np.arange(len(rows))
    ax.barh(ys + 0.2, [r["whole_ms_per_row"] for r in rows], 0.4, label="the whole distribution (Sampler.probs)")
    ax.barh(ys - 0.2, [r["accepts_ms_per_row"] for r in rows], 0.4, label="Sampler.accepts")
    ax.plot([r["draft_distribution_ms_per_row"] for r in rows], ys, "k|", ms=14, mew=2,
            label=f"the device: draft_distribution, top {DRAFT_TOP_K}")
    for y, r in zip(ys, rows):
        ax.text(r["whole_ms_per_row"], y + 0.2, f" {r['whole_over_accepts']:.1f}x", va="center", fontsize=8)
    ax.set_yticks(ys, [r["sampler"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per drafted token's test (median of {result['settings']['repeats']}), "
                  f"{result['vocab']:,} logits a row")
    ax.set_title(f"Is u q(x) < p(x)? A sampling row on the host ({result['pair']})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, replot=True, pair="gemma-270m", repeats=9, out="sampling_rows")
    ap.add_argument("--rows", type=int, default=32, help="rows of the target's logits along the text")
    args = C.parse(ap, plot=plot)
    rows, tokens = target_rows(args.pair, args.rows, args.threads or None)
    results = measure(rows, tokens, args.repeats)
    print(C.table(["sampler", "rows", "accepted", "probs ms/row", "accepts ms/row", "ratio", "took probs",
                   "draft_distribution ms/row"],
                  [[r["sampler"], r["rows"], r["accepted"], r["whole_ms_per_row"], r["accepts_ms_per_row"],
                    r["whole_over_accepts"], r["took_probs"], r["draft_distribution_ms_per_row"]] for r in results]))
    payload = {"settings": vars(args), "pair": args.pair, "vocab": int(rows.shape[1]), "results": results}
    path = C.write_result(args.out, payload)
    plot(payload, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
