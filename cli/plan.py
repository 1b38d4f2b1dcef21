"""`edgekit plan`: batches and window for a set of prompts against a verifier (paper 003, III-B)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ._common import _DRAFT, _INSECURE, _TARGET, _TOKEN, PAIR_HELP, VERIFIER_HELP, note, print_json, timeout_option


def _prompts(path: Path) -> list[str]:
    """One prompt per line, or JSON lines with a "prompt" field."""
    if not path.is_file():
        raise typer.BadParameter(f"no such file: {path}")
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                out.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError) as exc:
                raise typer.BadParameter(f"{path}: a JSON line without a \"prompt\": {line[:60]}") from exc
        else:
            out.append(line)
    if not out:
        raise typer.BadParameter(f"{path} holds no prompts")
    return out


def plan(
    prompts_file: Path = typer.Argument(..., help="Prompts: one per line, or JSON lines with a \"prompt\" field."),
    draft: str | None = _DRAFT,
    target: str | None = _TARGET,
    pair: str = typer.Option("gemma-270m", "--pair", help=PAIR_HELP),
    verifier: str | None = typer.Option(None, "--verifier", help=VERIFIER_HELP),
    max_tokens: int = typer.Option(64, "--max-tokens", "-n", min=1, help="Tokens each task is planned for."),
    max_window: int = typer.Option(8, "--max-window", min=1, max=32, help="Longest window considered."),
    memory_mb: float = typer.Option(0.0, "--memory-mb", min=0.0, help="Memory for the draft (0: no bound)."),
    acceptance: float | None = typer.Option(
        None, "--acceptance", min=0.0, max=0.999, help="Per-token acceptance (default: measured on the first prompt)."
    ),
    threads: int | None = typer.Option(None, "--threads", min=1, help="Draft threads (default: EDGEKIT_THREADS)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    token: str | None = _TOKEN,
    insecure: bool = _INSECURE,
    timeout: float = timeout_option(30.0),
) -> None:
    """Plan a set of prompts: the batches and window with the least predicted total latency
    (the latency model and dynamic program of paper 003, fitted here and against the verifier)."""
    import math

    from edgekit import GenerationConfig
    from edgekit.models import get_pair
    from edgekit.models.refs import resolve_for_use
    from edgekit.plan import ServingModel, calibrate_draft, calibrate_verify, verifier_shape
    from edgekit.plan import plan as make_plan

    from . import _connect

    texts = _prompts(prompts_file)
    with _connect.build_client(pair=pair, verifier=verifier, draft=draft, target=target, timeout=timeout,
                               token=token, insecure=insecure, generation=GenerationConfig(max_tokens=max_tokens),
                               announce=not json_out) as client:
        info = client.server_info()
        inputs = [len(client.tokenize(t)) for t in texts]
        if not json_out:
            note(f"calibrating the draft ({client.draft.name}) on this device ...")
        draft_file = resolve_for_use(draft if draft is not None else get_pair(pair).draft, role="draft").path
        draft_shape, draft_rt, draft_samples = calibrate_draft(draft_file, threads=threads)
        vshape = verifier_shape(info.target_hidden_size)
        verify_rt, verify_samples = calibrate_verify(client.transport, client.draft.fingerprint(),
                                                     client.tokenize(texts[0]), vshape)
        probed = client.probe_link(pings=5).link
        if acceptance is None:
            stats = client.generate(texts[0], drafting="fixed", draft_k=4, max_tokens=48,
                                    plain_when_faster=False).until_done().stats
            rejections = sum(r.accepted < r.drafted for r in stats.rounds_detail)
            acceptance = stats.accepted / max(stats.accepted + rejections, 1)
        model = ServingModel(draft_shape, vshape, draft_rt, verify_rt, acceptance, max_tokens,
                             link_s=probed.rtt_ms / 1e3, memory_bytes=memory_mb * 2**20 if memory_mb else math.inf)
        best = make_plan(model, inputs, max_window)
        alone = sum(model.latency([[k]], inputs, best.window) for k in range(len(inputs)))
        together = model.latency([list(range(len(inputs)))], inputs, best.window)
    result = {
        "prompts": len(texts), "input_tokens": inputs, "max_tokens": max_tokens, "acceptance": acceptance,
        "rtt_ms": probed.rtt_ms, "window": best.window, "batches": [list(b) for b in best.batches],
        "predicted_s": best.predicted_s, "one_after_another_s": alone, "one_batch_s": together,
        "draft_runtime": {"c1": draft_rt.c1, "c2": draft_rt.c2, "mape": draft_rt.error(draft_samples)},
        "verify_runtime": {"c1": verify_rt.c1, "c2": verify_rt.c2, "mape": verify_rt.error(verify_samples)},
    }
    if json_out:
        print_json(result)
        return
    print(f"{len(texts)} prompts ({min(inputs)}-{max(inputs)} tokens), {max_tokens} tokens each; "
          f"acceptance {acceptance:.2f}, RTT {probed.rtt_ms:.1f} ms")
    print(f"window {best.window}, {len(best.batches)} batches (in pipeline order):")
    for i, b in enumerate(best.batches, 1):
        print(f"  {i}. prompts {', '.join(str(k + 1) for k in b)}  (inputs up to {max(inputs[k] for k in b)} tokens)")
    print(f"predicted total: {best.predicted_s:.2f} s (one after another: {alone:.2f} s; all in one batch: "
          f"{together:.2f} s)")
    print(f"fits: draft MAPE {result['draft_runtime']['mape']:.1%}, verify MAPE {result['verify_runtime']['mape']:.1%}")
