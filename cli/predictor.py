"""`edgekit predictor collect|train|schedule|list`: traces, training and the shipped predictors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from ._common import _INSECURE, _TOKEN, PAIR_HELP, VERIFIER_HELP, note, print_json, timeout_option

if TYPE_CHECKING:
    from edgekit.predictors.collect import Trace

app = typer.Typer(help="The WISP rejection predictor: collect traces, train, export to ONNX.", no_args_is_help=True)


def _default_prompts() -> Path:
    from edgekit.predictors import TRAIN_PROMPTS

    return TRAIN_PROMPTS


@app.command()
def collect(
    out: Path = typer.Option(..., "--out", "-o", help="Trace file to write (.npz)."),
    pair: str = typer.Option("gemma-270m", "--pair", help=PAIR_HELP),
    verifier: str | None = typer.Option(None, "--verifier", help=VERIFIER_HELP),
    prompts: Path | None = typer.Option(
        None, "--prompts", help="JSONL prompt set; default: the training set shipped with edgekit."
    ),
    limit: int = typer.Option(0, "--limit", min=0, help="Use only the first N prompts (0: all)."),
    window: int = typer.Option(8, "--window", "-k", min=1, max=64, help="Fixed draft window while recording."),
    max_tokens: int = typer.Option(64, "--max-tokens", "-n", min=1, help="Tokens generated per prompt."),
    mode: str = typer.Option("greedy", "--mode", help="greedy or sample (labels depend on the acceptance rule)."),
    seed: int = typer.Option(0, "--seed"),
    numerics: str = typer.Option("exact", "--numerics", help="Numerics of the local verifier: exact or fast."),
    timeout: float = timeout_option(60.0),
    token: str | None = _TOKEN,
    insecure: bool = _INSECURE,
    json_out: bool = typer.Option(False, "--json", help="Print the trace summary as JSON."),
) -> None:
    """Run speculative decoding with a fixed window over a prompt set and record
    each drafted position's features and outcome (accepted / first rejection)."""
    from edgekit import GenerationConfig, ServerConfig
    from edgekit.config import Mode, Numerics
    from edgekit.predictors.collect import collect as run_collect
    from edgekit.predictors.collect import load_prompts

    from . import _connect

    rows = load_prompts(prompts or _default_prompts())
    if limit:
        rows = rows[:limit]
    gen = GenerationConfig(mode=cast(Mode, mode), drafting="fixed", draft_k=window, max_tokens=max_tokens)
    local = ServerConfig(port=0, max_sessions=2, numerics=cast(Numerics, numerics))
    with _connect.build_client(
        pair=pair, verifier=verifier, timeout=timeout, token=token, insecure=insecure, generation=gen,
        local_server=local,
    ) as client:

        def progress(i: int, p: dict, n: int) -> None:
            note(f"[{i + 1}/{len(rows)}] {p['id']}: {n} positions")

        trace = run_collect(
            client, rows, window=window, max_tokens=max_tokens, mode=mode, seed=seed, on_prompt=progress
        )
    trace.header["pair"] = pair
    trace.header["verifier_numerics"] = numerics if verifier is None else "remote"
    trace.save(out)
    summary = _summary(trace)
    summary["path"] = str(out)
    if json_out:
        print_json(summary)
    else:
        note(
            f"wrote {out}: {summary['positions']} positions, {summary['accepted']} accepted, "
            f"{summary['first_rejections']} first rejections, {summary['after_rejection']} after "
            f"({trace.header['seconds']} s)"
        )


def _summary(trace: Trace) -> dict:
    return {
        "positions": len(trace.label),
        "accepted": int((trace.label == 1).sum()),
        "first_rejections": int((trace.label == 0).sum()),
        "after_rejection": int((trace.label == -1).sum()),
        "prompts": len(trace.header.get("prompts", [])),
        "draft": trace.header.get("draft"),
        "target": trace.header.get("target"),
    }


def _load_traces(traces: list[Path]) -> Trace:
    """The trace files of one pair as one trace, their prompts kept distinct (the split is by prompt)."""
    from edgekit.errors import ConfigError
    from edgekit.predictors.collect import Trace

    try:
        loaded = [Trace.load(t) for t in traces]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot read trace: {exc}") from exc
    pairs = {(t.header.get("draft"), t.header.get("target")) for t in loaded}
    if len(pairs) > 1:
        raise ConfigError(f"the traces come from different model pairs: {sorted(pairs)}")
    offset = 0
    for t in loaded:
        t.prompt = t.prompt + offset
        offset += len(t.header.get("prompts", [])) or int(t.prompt.max(initial=-1)) + 1
    trace = Trace.concat(loaded)
    trace.header = dict(loaded[0].header, prompts=[p for t in loaded for p in t.header.get("prompts", [])])
    return trace


@app.command()
def train(
    traces: list[Path] = typer.Argument(..., help="Trace files from `edgekit predictor collect` (same pair)."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Output stem: writes STEM.onnx, STEM.json (metric card), STEM.md."
    ),
    round_ms: float = typer.Option(
        60.0, "--round-ms", help="Cost model: fixed time of a round (RTT + verification), ms."
    ),
    verify_token_ms: float = typer.Option(
        0.0, "--verify-token-ms", help="Cost model: verification time per block token, ms."
    ),
    draft_step_ms: float | None = typer.Option(
        None, "--draft-step-ms", help="Cost model: draft step, ms (default: measured in the trace)."
    ),
    max_window: int | None = typer.Option(
        None, "--max-window", min=1, max=64, help="Largest block (default: the trace's window)."
    ),
    features: str | None = typer.Option(
        None, "--features", help="Comma-separated feature names (default: all but recent_acceptance)."
    ),
    seed: int = typer.Option(0, "--seed"),
    json_out: bool = typer.Option(False, "--json", help="Print the metric card as JSON."),
) -> None:
    (
        """Fit the MLP and a logistic baseline, pick the threshold by expected goodput, """
        """export to ONNX with a metric card."""
    )
    from edgekit.errors import ConfigError
    from edgekit.predictors.features import FEATURE_NAMES
    from edgekit.predictors.pipeline import train_from_trace
    from edgekit.predictors.train import DEFAULT_FEATURES, CostModel

    trace = _load_traces(traces)
    names = tuple(n.strip() for n in features.split(",")) if features else DEFAULT_FEATURES
    unknown = [n for n in names if n not in FEATURE_NAMES]
    if unknown:
        raise ConfigError(f"unknown features {', '.join(unknown)}; choose from {', '.join(FEATURE_NAMES)}")
    measured = trace.header.get("cost_model", {}).get("draft_step_ms")
    if draft_step_ms is None and measured is None:
        raise ConfigError("the trace has no measured draft step time; pass --draft-step-ms")
    cost = CostModel(draft_step_ms=draft_step_ms or measured, round_ms=round_ms, verify_token_ms=verify_token_ms)
    try:
        card = train_from_trace(trace, out, cost=cost, max_window=max_window, feature_names=names, seed=seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if json_out:
        print_json(card)
        return
    m = card["metrics_validation"]
    r = card["replay_validation"]["predictor"]
    note(
        f"wrote {card['path']} ({card['model']}, threshold {card['threshold']:.3f}): validation AUC {m['auc']:.3f}, "
        f"specificity {m['specificity']:.3f}, recall on accepted {m['recall_accepted']:.3f}; replayed acceptance "
        f"{r['acceptance_rate']:.3f}, goodput {r['goodput_tok_s']:.1f} tok/s "
        f"(best fixed window {card['best_fixed_window']}: "
        f"{card['replay_validation']['fixed-' + str(card['best_fixed_window'])]['goodput_tok_s']:.1f})"
    )


@app.command()
def schedule(
    card: Path = typer.Argument(..., help="A trained predictor's card (STEM.json, beside STEM.onnx)."),
    traces: list[Path] = typer.Argument(..., help="The trace files it was trained on, in the same order."),
    json_out: bool = typer.Option(False, "--json", help="Print the card as JSON."),
) -> None:
    """Tabulate a trained predictor's stopping rule by round cost (its delay schedule) into its card.

    `train` writes the schedule already; this adds it to a card trained before it existed,
    from the same validation prompts, without touching the ONNX file."""
    from edgekit.errors import ConfigError
    from edgekit.predictors.pipeline import schedule_card

    if not card.is_file() or not card.with_suffix(".onnx").is_file():
        raise ConfigError(f"{card} is not a predictor card beside its ONNX model ({card.with_suffix('.onnx')})")
    out = schedule_card(card, _load_traces(traces))
    if json_out:
        print_json(out)
        return
    points = out["delay_schedule"]
    note(f"wrote the delay schedule of {card} ({len(points)} round costs) and {card.with_suffix('.md')}")


@app.command("list")
def list_(json_out: bool = typer.Option(False, "--json", help="Print the metric cards as JSON.")) -> None:
    """The predictors shipped with edgekit, with their held-out figures."""
    from edgekit.predictors import shipped_cards

    cards = shipped_cards()
    if json_out:
        print_json(cards)
        return
    for c in cards:
        m = c["metrics_validation"]
        typer.echo(
            f"{c['pair']:<11} {c['model']:<8} threshold {c['threshold']:.3f}  AUC {m['auc']:.3f}  "
            f"recall accepted {m['recall_accepted']:.3f}  specificity {m['specificity']:.3f}  {c['path']}"
        )
