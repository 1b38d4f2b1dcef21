"""`edgekit profile`: per-token cost of drafting, features and predictor on this device."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from ._common import _DRAFT, PAIR_HELP, note, print_json


def profile(
    draft_ref: str | None = _DRAFT,
    pair: str = typer.Option("gemma-270m", "--pair", help=PAIR_HELP),
    predictor: str | None = typer.Option(
        None, "--predictor", help="ONNX predictor to time; default: the one shipped for the pair; 'none' to skip."
    ),
    steps: int = typer.Option(400, "--steps", min=20, help="Draft steps to time (half plain, half deciding)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="llama.cpp threads (default: all cores)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Also draw the step times into this PNG (needs the bench "
                                     "extra: matplotlib)."),
) -> None:
    """Time a draft step and what the predictor's decision adds to it (median and p99, microseconds)."""
    if threads:
        os.environ["EDGEKIT_THREADS"] = str(threads)
    from edgekit import LlamaDraftModel
    from edgekit.drafting import shipped_predictor
    from edgekit.errors import ConfigError
    from edgekit.models import get_pair
    from edgekit.models.refs import resolve_for_use
    from edgekit.predictors.profile import profile_drafting

    spec = get_pair(pair)
    resolved = resolve_for_use(draft_ref if draft_ref is not None else spec.draft, role="draft")
    pred = None
    if predictor != "none":
        from edgekit.drafting import OnnxPredictor

        path = predictor or shipped_predictor(resolved.name, spec.target)
        if path is None:
            raise ConfigError(
                f"no predictor is shipped for {resolved.name} with {spec.target}; "
                "pass --predictor PATH or --predictor none"
            )
        pred = OnnxPredictor(path)
    draft = LlamaDraftModel(resolved.path, name=resolved.name, n_ctx=1024)
    try:
        result = profile_drafting(draft, pred, steps=steps, samples=plot is not None)
    finally:
        draft.close()
    result["pair"] = pair
    if plot is not None:
        note(f"figure: {_plot_steps(result, plot)}")
        result.pop("samples_us")
    if json_out:
        print_json(result)
        return
    rows = [("draft step", result["draft_step_us"], None)]
    rows.append(("added by the decision", result["added_us"], result["added_share"]))
    rows.append(("  features, timed", result["features_us"], result["features_share"]))
    if pred is not None:
        rows.append(("  predictor, timed", result["predictor_us"], result["predictor_share"]))
    typer.echo(
        f"{pair}: {result['draft']} (vocab {result['n_vocab']}), {steps} steps, threads {result['threads']}, "
        f"logit kernel {result['kernel']}"
    )
    for name, t, share in rows:
        share_s = f"  {100 * share:5.2f}% of a step" if share is not None else ""
        typer.echo(f"  {name:<22} median {t['median']:>9.1f} us   p99 {t['p99']:>9.1f} us{share_s}")
    typer.echo(
        "  (added: the median difference between neighbouring steps with and without the decision;\n"
        "   the timed parts also carry the cache refill after each decode that a plain step pays elsewhere)"
    )


def _plot_steps(r: dict, path: Path) -> Path:
    """The distribution of plain and deciding draft steps, and what a decision's parts cost."""
    import numpy as np

    from ._plot import figure, save

    fig, (steps, parts) = figure(2)
    t = r["samples_us"]
    both = t["plain"] + t["deciding"]
    bins = np.linspace(float(np.percentile(both, 0.5)) * 0.95, float(np.percentile(both, 99.5)) * 1.05, 60)
    steps.hist([x / 1e3 for x in t["plain"]], bins=bins / 1e3, alpha=0.6, label="plain step (decode, argmax)")
    steps.hist([x / 1e3 for x in t["deciding"]], bins=bins / 1e3, alpha=0.6,
               label="deciding step (+ features, predictor)")
    steps.set_xlabel("ms per draft step")
    steps.set_ylabel("steps")
    steps.set_title(f"{r['draft']}, threads {r['threads']}, kernel {r['kernel']}", fontsize=9)
    steps.legend(fontsize=8)
    names = ["features", "predictor"] if t["predictor"] else ["features"]
    data = [t["features"], t["predictor"]] if t["predictor"] else [t["features"]]
    parts.boxplot(data, showfliers=False)
    parts.set_xticks(range(1, len(names) + 1), names)
    parts.set_ylabel("us per decision (in-loop timers)")
    budget = 0.02 * r["draft_step_us"]["median"]
    parts.axhline(budget, color="r", linestyle="--", label=f"2% of a median step: {budget:.0f} us")
    parts.set_title(f"added per step, median: {r['added_us']['median']:.0f} us ({100 * r['added_share']:.2f}%)",
                    fontsize=9)
    parts.legend(fontsize=8)
    parts.set_ylim(bottom=0)
    return save(fig, path)
