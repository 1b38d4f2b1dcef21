"""`edgekit generate`: one non-interactive generation, optionally as JSON."""

from __future__ import annotations

import sys
from enum import Enum
from typing import cast

import typer

from ._common import (
    _DRAFT,
    _DRAFTING,
    _FREQUENCY_PENALTY,
    _HIDDEN_ENCODING,
    _INSECURE,
    _MAX_WINDOW,
    _MIN_P,
    _ON_DISCONNECT,
    _P_MIN,
    _PREDICTOR,
    _PREDICTOR_SCHEDULE,
    _PRESENCE_PENALTY,
    _PROACTIVE,
    _REPEAT_LAST_N,
    _REPEAT_PENALTY,
    _RETRY_FOR,
    _SEMANTIC_THRESHOLD,
    _SLO_CLASS,
    _TARGET,
    _TARGET_SPEED,
    _TOKEN,
    _TOP_K,
    _TOP_P,
    _UPLOAD,
    _YES,
    MODE_HELP,
    PAIR_HELP,
    VERIFIER_HELP,
    note,
    print_json,
    sampler_options,
    semantic_summary,
    timeout_option,
    upload_for,
)


class Mode(str, Enum):
    greedy = "greedy"
    sample = "sample"
    semantic = "semantic"


class Baseline(str, Enum):
    target_only = "target-only"


def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="Prompt text (a raw completion prompt, no chat template)."),
    draft: str | None = _DRAFT,
    target: str | None = _TARGET,
    yes: bool = _YES,
    pair: str | None = typer.Option(None, "--pair", help=PAIR_HELP),
    verifier: str | None = typer.Option(None, "--verifier", help=VERIFIER_HELP),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", min=1, help="Most tokens to generate."),
    mode: Mode = typer.Option(Mode.greedy, "--mode", help=MODE_HELP),
    semantic_threshold: float | None = _SEMANTIC_THRESHOLD,
    temperature: float = typer.Option(0.8, "--temperature", "-t", help="Sampling temperature (mode sample)."),
    top_k: int | None = _TOP_K,
    top_p: float | None = _TOP_P,
    min_p: float | None = _MIN_P,
    repeat_penalty: float | None = _REPEAT_PENALTY,
    frequency_penalty: float | None = _FREQUENCY_PENALTY,
    presence_penalty: float | None = _PRESENCE_PENALTY,
    repeat_last_n: int | None = _REPEAT_LAST_N,
    draft_k: int = typer.Option(
        4, "--draft-k", "-k", min=1, max=64, help="Fixed draft window K: tokens drafted per round."
    ),
    drafting: str = _DRAFTING,
    predictor: str | None = _PREDICTOR,
    predictor_schedule: bool = _PREDICTOR_SCHEDULE,
    max_window: int = _MAX_WINDOW,
    p_min: float = _P_MIN,
    upload: str | None = _UPLOAD,
    slo_class: str | None = _SLO_CLASS,
    target_speed: float | None = _TARGET_SPEED,
    hidden_encoding: str = _HIDDEN_ENCODING,
    seed: int | None = typer.Option(None, "--seed", help="Seed for sampling on both sides (reproducible runs)."),
    stop: list[str] | None = typer.Option(
        None, "--stop", metavar="TEXT",
        help="End the answer before this text (repeatable; the text is not printed; finish: stop).",
    ),
    baseline: Baseline | None = typer.Option(
        None, "--baseline", help="target-only: generate with the verifier's target alone (centralized baseline)."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object (token ids, text, metrics) and nothing else."
    ),
    rounds: bool = typer.Option(False, "--rounds", help="With --json, include per-round figures."),
    token: str | None = _TOKEN,
    insecure: bool = _INSECURE,
    timeout: float = timeout_option(30.0),
    retry_for: float | None = _RETRY_FOR,
    on_disconnect: str | None = _ON_DISCONNECT,
    proactive: bool = _PROACTIVE,
) -> None:
    """Generate a completion by speculative decoding (or by the target alone with --baseline)."""
    from edgekit import GenerationConfig, Resumed, TextDelta
    from edgekit.config import HiddenEncoding, Upload
    from edgekit.errors import EdgekitError

    from . import _connect

    gen = GenerationConfig(
        max_tokens=max_tokens, mode=mode.value, temperature=temperature, draft_k=draft_k, seed=seed,
        drafting=drafting, predictor=predictor, max_window=max_window, p_min=p_min,
        predictor_schedule=predictor_schedule,
        slo_class=slo_class, target_speed=target_speed, proactive=proactive,
        upload=cast(Upload, upload_for(upload, mode.value)), hidden_encoding=cast(HiddenEncoding, hidden_encoding),
        semantic_threshold=semantic_threshold, stop=tuple(stop or ()),
        **sampler_options(top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n),
    )
    with _connect.build_client(
        pair=pair if verifier else pair or "gemma-270m", verifier=verifier, timeout=timeout, token=token,
        insecure=insecure,
        draft=draft, target=target, yes=yes,
        generation=gen, announce=not json_out,
        retry_for=retry_for, on_disconnect=on_disconnect,
    ) as client:
        info = client.server_info()
        stream = client.generate_target_only(prompt) if baseline else client.generate(prompt)
        ids: list[int] = []
        parts: list[str] = []
        outages: list[dict] = []
        try:
            with stream:
                for event in stream:
                    if isinstance(event, TextDelta):
                        ids.extend(event.token_ids)
                        parts.append(event.text)
                        if not json_out:
                            sys.stdout.write(event.text)
                            sys.stdout.flush()
                    elif isinstance(event, Resumed):
                        outages.append({"outage_ms": event.outage_ms, "reprefilled_tokens": event.reprefilled_tokens})
                        note(f"[verifier lost for {event.outage_ms / 1e3:.1f} s; resumed]")
        except EdgekitError as exc:
            # What was generated before the failure is kept: printed (text mode), or in the JSON.
            if json_out:
                print_json(
                    {
                        "pair": client.pair,
                        "verifier": verifier or client.local_verifier_address,
                        "prompt": prompt,
                        "token_ids": ids,
                        "text": "".join(parts),
                        "finish_reason": "error",
                        "error": {"type": type(exc).__name__, "message": str(exc)},
                        "outages": outages,
                    }
                )
            else:
                sys.stdout.write("\n")
            raise
        final = stream.final
        assert final is not None
        if json_out:
            print_json(
                {
                    "pair": client.pair,
                    "verifier": verifier or client.local_verifier_address,
                    "target_model": info.target_model,
                    "draft_model": client.draft.name,
                    "exact_numerics": info.exact_numerics,
                    "method": "target-only" if baseline else "speculative",
                    "mode": mode.value,
                    "sampler": final.stats.sampler,
                    "draft_k": 0 if baseline else draft_k,
                    "drafting": "target-only" if baseline else final.stats.drafting,
                    "seed": seed,
                    "stop": list(stop or ()),
                    "prompt": prompt,
                    "token_ids": list(final.token_ids),
                    "text": final.text,
                    "finish_reason": final.stats.finish_reason,
                    "outages": outages,
                    "metrics": final.stats.to_dict(rounds=rounds),
                }
            )
        else:
            s = final.stats
            sys.stdout.write("\n")
            if baseline:
                note(
                    f"[{s.completion_tokens} tokens, {s.tokens_per_second:.1f} tok/s, target only, "
                    f"finish: {s.finish_reason}]"
                )
            else:
                note(
                    f"[{s.completion_tokens} tokens, {s.tokens_per_second:.1f} tok/s, {s.rounds} rounds, "
                    f"acceptance {s.acceptance_rate:.2f}, AAL {s.accepted_length:.2f}{semantic_summary(s)}, "
                    f"finish: {s.finish_reason}]"
                )
