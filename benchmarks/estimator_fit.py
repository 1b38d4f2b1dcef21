"""How well the verification-time estimator fits measured batch times on this CPU (WISP Table 7, Fig. 9).

The pair's target is loaded as `edgekit serve` loads it (a `LlamaEngine` with
16 sessions of 4,096 tokens, max block 32, exact numerics unless `--numerics
fast`) and profiled with the verifier's own calibration routine
(`profile_batches`): random batches of three kinds, each timed around one
`run_batch` call: "cold" prefill chunks (1-2 fresh sequences, 8 to 128 tokens
each, no logits), "warm" verification rounds (1-8 sessions with cached
prefixes of 32-2,048 tokens, 1-17 new tokens each, every new row with logits)
and "mixed" (one cold chunk beside warm rounds). A training set (`--train`
batches, seed 1) and a held-out test set (`--test` batches, seed 2: other
random batches, as WISP draws its test set with another seed) are profiled one
after the other on the same engine, the three kinds in turn.

Two fits, on the training batches only, by the estimator's non-negative least
squares (`fit_coefficients`):

- shipped: T = a*N_linear + b_compute*N_interactions + b_read*N_cached + d*N_out + c
  (eq. 19 plus the logit rows, as the verifier uses it);
- eq. 19: the same without d*N_out, as published (`logit_rows=False`).

For each: the coefficients (ms per unit) and Table 7's figures (R^2, adjusted
R^2, RMSE, MAE, MAPE, max error; plus the share of batches predicted within
10%) on the training and the test batches, and on the test batches of each
kind (R^2 there is against that kind's own mean, so a kind whose batches all
cost about the same can have a low R^2 with small errors: read RMSE and MAPE).
The JSON holds every sample (features, ms, kind, split) and both fits'
predictions, so the figure can be redrawn (`--replot`). The PNG beside it:
(a, b) predicted against measured for each fit, test batches coloured by kind,
training batches grey, with y = x and a +-10% band; (c) relative error against
measured time, train and test, both fits; (d) the cumulative distribution of
the absolute relative error (the share of batches within 10% where it crosses
the dashed line).

    python -m benchmarks estimator_fit                                  # gemma-270m, exact: results/estimator_fit
    python -m benchmarks estimator_fit --pair qwen-coder                # results/estimator_fit_qwen-coder_exact
    python -m benchmarks estimator_fit --numerics fast                  # results/estimator_fit_gemma-270m_fast
    python -m benchmarks estimator_fit --replot benchmarks/results/estimator_fit.json   # redraw, reprint
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C
from edgekit import ServerConfig
from edgekit.models import get_pair, model_path
from edgekit.verifier import Coefficients, LlamaEngine, fit_coefficients, fit_report, profile_batches

FEATURES = ("n_linear", "n_interactions", "n_cached", "n_out", "batches")  # batch_features' columns
KINDS = ("cold", "warm", "mixed")  # what profile_batches runs

DEFAULT_PAIR = "gemma-270m"
FITS = {  # name: (logit_rows, label)
    "shipped": (True, "shipped (eq. 19 + d·N_out)"),
    "eq19": (False, "eq. 19 as published"),
}
KIND_COLOURS = {"cold": "tab:blue", "warm": "tab:orange", "mixed": "tab:green"}
FIT_COLOURS = {"shipped": "tab:purple", "eq19": "tab:red"}
COEF_UNITS = {
    "a": "ms / new token",
    "b_compute": "ms / query-key pair",
    "b_read": "ms / cached token",
    "d_out": "ms / logit row",
    "c": "ms / batch",
}


# -- measuring -----------------------------------------------------------------------


def profile(engine: LlamaEngine, args: argparse.Namespace, split: str, trials: int, seed: int) -> dict[str, Any]:
    step = max(1, trials // 10)

    def report(i: int, n: int) -> None:
        if i % step == 0 or i == n:
            C.progress(f"{split}: {i}/{n} batches")

    t0 = time.perf_counter()
    feats, ms, kinds = profile_batches(
        engine,
        n_seq=args.max_sessions,
        max_context=args.max_context,
        max_block=args.max_block,
        prefill_chunk=args.prefill_chunk,
        trials=trials,
        seed=seed,
        kinds=KINDS,
        progress=report,
    )
    return {"trials": trials, "seed": seed, "seconds": time.perf_counter() - t0,
            "features": feats, "ms": ms, "kinds": kinds}


def metrics(coef: Coefficients, feats: np.ndarray, ms: np.ndarray, terms: int) -> dict[str, Any] | None:
    """Table 7's figures for these samples (None for none), with the share predicted within 10%."""
    if len(ms) == 0:
        return None
    out = dataclasses.asdict(fit_report(coef, feats, ms, terms=terms))
    rel = (feats @ coef.vector() - ms) / ms
    out["within_10pct"] = float(np.mean(np.abs(rel) <= 0.10))
    return out


def fit_all(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Both fits on the training samples; their metrics on each split, overall and by kind."""
    feats = np.array([s["features"] for s in samples], dtype=np.float64)
    ms = np.array([s["ms"] for s in samples], dtype=np.float64)
    split = np.array([s["split"] for s in samples])
    kind = np.array([s["kind"] for s in samples])
    train = split == "train"
    fits: dict[str, Any] = {}
    for name, (logit_rows, label) in FITS.items():
        coef = fit_coefficients(feats[train], ms[train], logit_rows=logit_rows)
        per_split: dict[str, Any] = {}
        for sp in ("train", "test"):
            terms = 4 if logit_rows else 3
            rows = {"all": metrics(coef, feats[split == sp], ms[split == sp], terms)}
            for k in KINDS:
                sel = (split == sp) & (kind == k)
                rows[k] = metrics(coef, feats[sel], ms[sel], terms)
            per_split[sp] = rows
        fits[name] = {
            "label": label,
            "logit_rows": logit_rows,
            "coefficients_ms": dataclasses.asdict(coef),
            "coefficient_units": COEF_UNITS,
            "metrics": per_split,
        }
        pred = feats @ coef.vector()
        for s, p in zip(samples, pred):
            s.setdefault("pred_ms", {})[name] = float(p)
    return fits


# -- figure --------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> Path:
    samples = result["samples"]
    ms = np.array([s["ms"] for s in samples])
    split = np.array([s["split"] for s in samples])
    kind = np.array([s["kind"] for s in samples])
    feats = np.array([s["features"] for s in samples])
    pred = {name: feats @ Coefficients(**fit["coefficients_ms"]).vector() for name, fit in result["fits"].items()}
    fig, axes = C.subplots(4, width=4.9, height=4.6)
    every = np.concatenate([ms, *pred.values()])
    lo, hi = 0.8 * every[every > 0].min(), 1.25 * every.max()  # a log scale: a prediction of 0 falls off it
    line = np.geomspace(lo, hi, 50)
    title = f"{result['target']} ({result['numerics']})"
    for ax, (name, fit) in zip(axes[:2], result["fits"].items()):
        p = pred[name]
        train = split == "train"
        ax.scatter(ms[train], p[train], s=10, c="0.7", label=f"train ({int(train.sum())})")
        for k in KINDS:
            sel = (split == "test") & (kind == k)
            ax.scatter(ms[sel], p[sel], s=22, c=KIND_COLOURS[k], edgecolors="k", linewidths=0.3,
                       label=f"test, {k} ({int(sel.sum())})")
        ax.plot(line, line, "k-", linewidth=1, label="y = x")
        ax.fill_between(line, 0.9 * line, 1.1 * line, color="k", alpha=0.1, label="±10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured batch time, ms")
        ax.set_ylabel("predicted, ms")
        test = fit["metrics"]["test"]["all"]
        ax.set_title(f"{fit['label']}\n{title}: test R² {test['r2']:.3f}, MAPE {test['mape_pct']:.1f}%", fontsize=9)
    ax_rel, ax_cdf = axes[2], axes[3]
    rel = {name: 100 * (p - ms) / ms for name, p in pred.items()}
    for name, fit in result["fits"].items():
        for sp, marker, alpha in (("train", "o", 0.35), ("test", "^", 0.9)):
            sel = split == sp
            ax_rel.scatter(ms[sel], rel[name][sel], s=14 if sp == "train" else 22, marker=marker, alpha=alpha,
                           c=FIT_COLOURS[name], label=f"{fit['label']}, {sp}")
    ax_rel.axhline(0, color="k", linewidth=1)
    ax_rel.axhspan(-10, 10, color="k", alpha=0.1, label="±10%")
    ax_rel.set_xscale("log")
    ax_rel.set_xlabel("measured batch time, ms")
    ax_rel.set_ylabel("relative error (predicted − measured) / measured, %")
    ax_rel.set_title(f"{title}: relative error", fontsize=9)
    for name, fit in result["fits"].items():
        for sp, style in (("train", ":"), ("test", "-")):
            err = np.sort(np.abs(rel[name][split == sp]))
            share = np.arange(1, len(err) + 1) / len(err)
            ax_cdf.step(np.concatenate([[0.0], err]), np.concatenate([[0.0], share]), where="post", linestyle=style,
                        linewidth=1.5, color=FIT_COLOURS[name], label=f"{fit['label']}, {sp}")
    ax_cdf.axvline(10, color="k", linewidth=1, linestyle="--", label="10%")
    ax_cdf.set_xscale("symlog", linthresh=1.0)
    ax_cdf.set_xlim(0, 1.5 * max(20.0, max(float(np.abs(r).max()) for r in rel.values())))
    ax_cdf.set_ylim(0, 1.02)
    ax_cdf.set_xlabel("|relative error|, % (linear below 1%)")
    ax_cdf.set_ylabel("share of batches with at most this error")
    ax_cdf.set_title(f"{title}: distribution of the relative error", fontsize=9)
    return C.save_figure(fig, path)


# -- tables --------------------------------------------------------------------------


def print_tables(result: dict[str, Any]) -> None:
    fits = result["fits"]
    print(f"\n{result['target']} ({result['numerics']} numerics, threads {result['threads'] or 'default'}): "
          f"coefficients fitted on {result['profile']['train']['trials']} training batches")
    rows = [[fit["label"]] + [f"{fit['coefficients_ms'][c]:.4g}" for c in COEF_UNITS] for fit in fits.values()]
    print(C.table(["fit"] + [f"{c} ({u})" for c, u in COEF_UNITS.items()], rows))
    headers = ["fit", "split", "kind", "n", "R²", "adj. R²", "RMSE ms", "MAE ms", "MAPE %", "max err ms", "within 10%"]
    rows = []
    for fit in fits.values():
        for sp, kinds in (("train", ("all",)), ("test", ("all", *KINDS))):
            for k in kinds:
                m = fit["metrics"][sp][k]
                if m is None:
                    continue
                rows.append([fit["label"], sp, k, m["samples"], m["r2"], m["adjusted_r2"], m["rmse_ms"], m["mae_ms"],
                             m["mape_pct"], m["max_error_ms"], f"{100 * m['within_10pct']:.0f}%"])
    print()
    print(C.table(headers, rows, digits=3))


# -- main ----------------------------------------------------------------------------


def replot(result: dict[str, Any], png: Path) -> None:
    """`--replot JSON`: the PNG beside a stored result redrawn and its tables printed, nothing measured."""
    drawn = plot(result, png)
    print_tables(result)
    print(png.with_suffix(".json"), drawn, sep="\n")


def main() -> None:
    serve = ServerConfig()
    ap = C.arguments(__doc__, whole_doc=True, replot=True, threads=1, pair=DEFAULT_PAIR, out=None)
    ap.add_argument("--numerics", choices=("exact", "fast"), default="exact")
    ap.add_argument("--train", type=int, default=120, help="training batches (default 120)")
    ap.add_argument("--test", type=int, default=50, help="held-out test batches (default 50)")
    ap.add_argument("--train-seed", type=int, default=1)
    ap.add_argument("--test-seed", type=int, default=2)
    like_serve = "as edgekit serve (default %(default)s)"
    ap.add_argument("--max-sessions", type=int, default=serve.max_sessions, help=like_serve)
    ap.add_argument("--max-context", type=int, default=serve.max_context, help=like_serve)
    ap.add_argument("--max-block", type=int, default=serve.max_block, help=like_serve)
    ap.add_argument("--prefill-chunk", type=int, default=serve.prefill_chunk,
                    help="longest cold chunk, as edgekit serve (default %(default)s)")
    args = C.parse(ap, plot=replot)  # --replot: redraw and print the tables (replot below)
    if args.train < 2 or args.test < 1:
        ap.error("--train needs at least 2 batches and --test at least 1")
    out = args.out or ("estimator_fit" if (args.pair, args.numerics) == (DEFAULT_PAIR, "exact")
                       else f"estimator_fit_{args.pair}_{args.numerics}")
    threads = args.threads or None
    spec = get_pair(args.pair)
    target = model_path(spec.target)
    t0 = time.perf_counter()
    engine = LlamaEngine(str(target), name=spec.target, max_context=args.max_context, n_seq=args.max_sessions,
                         max_block=args.max_block, exact=args.numerics == "exact", threads=threads)
    load_s = time.perf_counter() - t0
    C.progress(f"loaded {spec.target} ({args.numerics}) in {load_s:.1f} s; invariant batch {engine.invariant_batch}")
    try:
        runs = {
            "train": profile(engine, args, "train", args.train, args.train_seed),
            "test": profile(engine, args, "test", args.test, args.test_seed),
        }
    finally:
        engine.close()
    samples = [
        {"split": sp, "kind": k, "features": [float(x) for x in f], "ms": float(m)}
        for sp, run in runs.items()
        for f, m, k in zip(run["features"], run["ms"], run["kinds"])
    ]
    result: dict[str, Any] = {
        "pair": args.pair,
        "target": spec.target,
        "model_file": target.name,
        "numerics": args.numerics,
        "threads": threads,
        "engine": {
            "load_s": load_s,
            "invariant_batch": engine.invariant_batch,
            "mixes_sessions": engine.mixes_sessions,
            "max_sessions": args.max_sessions,
            "max_context": args.max_context,
            "max_block": args.max_block,
            "prefill_chunk": args.prefill_chunk,
        },
        "profile": {sp: {"trials": r["trials"], "seed": r["seed"], "seconds": r["seconds"]} for sp, r in runs.items()},
        "feature_names": list(FEATURES),
    }
    result["fits"] = fit_all(samples)
    result["samples"] = samples
    path = C.write_result(out, {"settings": vars(args), **result})
    png = plot(result, path.with_suffix(".png"))
    print_tables(result)
    print(path, png, sep="\n")


if __name__ == "__main__":
    main()
