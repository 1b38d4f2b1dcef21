"""`edgekit semantic collect|label|train|list`: the semantic head (WISV) from traces to ONNX."""

from __future__ import annotations

from pathlib import Path

import typer

from ._common import PAIR_HELP, note, print_json

app = typer.Typer(
    help="Semantic verification (WISV): trace checkable tasks, label mismatches by task outcome, train the "
    "CSI-aware decision head, export it to ONNX.",
    no_args_is_help=True,
)

TASKS_HELP = (
    "Comma-separated task sources: humaneval:train (even problem numbers; the odd ones are held out for "
    "evaluation and refused here), word:N[:SEED] (N generated arithmetic word problems)."
)


def _paths(pair: str) -> tuple[Path, Path]:
    from edgekit.models.cache import pair_paths

    return pair_paths(pair)


@app.command()
def collect(
    out: Path = typer.Option(..., "--out", "-o", help="Trace directory (created; a run resumes where it stopped)."),
    pair: str = typer.Option("qwen-coder", "--pair", help=PAIR_HELP),
    tasks: str = typer.Option("humaneval:train", "--tasks", help=TASKS_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help="llama.cpp threads (default: physical cores)."),
) -> None:
    """Each task's target greedy answer and outcome; at every mismatch the draft's and the target's
    hidden rows and tokens (WISV Stage 1)."""
    from edgekit.semantic.collect import collect as run
    from edgekit.semantic.tasks import task_set

    draft, target = _paths(pair)
    run(task_set(tasks), draft, target, out, pair=pair, threads=threads, log=note)


@app.command()
def label(
    traces: Path = typer.Argument(..., help="Trace directory from `edgekit semantic collect`."),
    pair: str = typer.Option("qwen-coder", "--pair", help=PAIR_HELP),
    tasks: str = typer.Option("humaneval:train", "--tasks", help=TASKS_HELP + " The sources it was traced on."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Stop after this many new labels."),
    minutes: float | None = typer.Option(None, "--minutes", min=0.1, help="Stop after this long (resumable)."),
    threads: int | None = typer.Option(None, "--threads", min=1),
) -> None:
    """Base labels by task outcome: keep the draft's token at a mismatch, let the target finish, run the
    task's check; critical when the outcome changes. Resumable: labels append one at a time."""
    from edgekit.semantic.collect import label as run
    from edgekit.semantic.tasks import task_set

    _, target = _paths(pair)
    added = run(task_set(tasks), target, traces, threads=threads, limit=limit,
                deadline_s=minutes * 60 if minutes else None, log=note)
    note(f"{added} new labels in {traces}")


@app.command()
def train(
    traces: Path = typer.Argument(..., help="A labelled trace directory."),
    out: Path = typer.Option(..., "--out", "-o", help="The head to write (.onnx; its card goes beside it)."),
    no_csi: bool = typer.Option(False, "--no-csi", help="The ablation: base labels, no CSI input (WISV Fig. 5)."),
    target_features: bool = typer.Option(
        False, "--target-features",
        help="Also read the target's confidence at each mismatch (entropy, log p of both tokens, their margin).",
    ),
    draws: int = typer.Option(8, "--draws", min=1, help="CSI draws per episode for relabeling (eqs. 28-31)."),
    critical_recall: float = typer.Option(
        0.9, "--critical-recall", min=0.0, max=1.0,
        help="The threshold rejects at least this share of critical validation mismatches on a perfect link.",
    ),
    rank: int = typer.Option(
        16, "--rank", min=0,
        help="Learn on this many principal directions of the hidden rows, folded into the first layer "
        "(0: the full rows).",
    ),
    seed: int = typer.Option(0, "--seed"),
    json_out: bool = typer.Option(False, "--json", help="Print the metric card as JSON."),
) -> None:
    """Train the decision head (eqs. 24-27), pick its threshold, export ONNX and write its metric card."""
    from edgekit.semantic.train import train_from_traces

    try:
        card = train_from_traces(traces, out, csi=not no_csi, target_features=target_features, draws=draws,
                                 critical_recall=critical_recall, rank=rank or None, seed=seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if json_out:
        print_json(card)
        return
    v = card["validation"]
    note(f"wrote {out} (threshold {card['threshold']:.4f}) and its card {out.with_suffix('.md')}")
    for name in ("good_link", "poor_link"):
        f = v[name]
        note(f"  {name.replace('_', ' ')}: AUC {f['auc']:.3f}, {f['accepted_share']:.1%} of validation mismatches "
             f"accepted, critical accepted {f['confusion']['fn']} of {f['confusion']['fn'] + f['confusion']['tp']}")


@app.command("list")
def list_heads(json_out: bool = typer.Option(False, "--json")) -> None:
    """The semantic heads shipped with edgekit, with their figures."""
    from edgekit.semantic.shipped import shipped_head_cards

    cards = shipped_head_cards()
    if json_out:
        print_json(cards)
        return
    if not cards:
        typer.echo("no semantic head is shipped")
    for c in cards:
        v = c["validation"]
        typer.echo(
            f"{c['pair']}: threshold {c['threshold']:.4f}, {c['data']['mismatches']} labelled mismatches, "
            f"validation AUC {v['good_link']['auc']:.3f}; accepts {v['good_link']['accepted_share']:.0%} of "
            f"mismatches on a good link, {v['poor_link']['accepted_share']:.0%} on a poor one ({c['path']})"
        )
