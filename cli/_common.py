"""Options and helpers shared by several commands."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from edgekit.registry import DRAFTING, Registry

PAIR_HELP = (
    "Draft/target pair from the model registry (see `edgekit models list`). Default with --verifier: the pair "
    "whose target the verifier serves (it is asked); without one, the pair whose target is started locally."
)
VERIFIER_HELP = (
    "Verifier: HOST:PORT or grpc://HOST:PORT (edgekit serve; grpcs:// for TLS), "
    "openai+http://HOST:PORT/v1 (an OpenAI-compatible completions server with prompt logprobs, such as vLLM or "
    "llama-cpp-python's server, not llama.cpp's llama-server: greedy, and sampling with a --top-k within its "
    "logprob cap, 20 unless ?max_logprobs=N; &route=generate|prefixes|prompt-logprobs picks how a round reads the "
    "target, auto by default: generate, one request a round, where vLLM offers it), "
    "sglang+http://HOST:PORT (SGLang's /generate), trtllm+http://HOST:PORT?max_draft_len=N (TensorRT-LLM's "
    "tensorrt_llm model on Triton: greedy). Several, "
    "comma-separated, serving one target: a lost verifier's sessions move to the next. "
    "Without it, the pair's target is started as a verifier on a free loopback port in this process."
)


MODEL_REF_FORMS = (
    "hf:ORG/REPO:QUANT or hf:ORG/REPO/FILE.gguf (the Hugging Face Hub, into its cache), ollama:NAME[:TAG] "
    "(Ollama's store, read in place), a path to a GGUF file, or a registry model (edgekit models list)"
)
DRAFT_HELP = f"The draft model: {MODEL_REF_FORMS}. Default: the pair's draft."
TARGET_HELP = (
    f"The target the local verifier serves (no --verifier): {MODEL_REF_FORMS}. Default: the pair's target. "
    "Checked against the draft's tokenizer before any weights load."
)
_DRAFT = typer.Option(None, "--draft", help=DRAFT_HELP)
_TOKEN = typer.Option(None, "--token", envvar="EDGEKIT_TOKEN", help="Bearer token for the verifier.")
_INSECURE = typer.Option(
    False, "--insecure", envvar="EDGEKIT_INSECURE",
    help="Send the verifier's token over plaintext (no TLS) to a verifier that is not on this machine: anyone on "
    "the path can read it. Without it such a connection is refused; use grpcs:// (or --tls) instead.",
)


def timeout_option(default: float) -> Any:
    """--timeout: each verifier call's deadline; EDGEKIT_TIMEOUT where the flag is not given."""
    return typer.Option(
        default, "--timeout", envvar="EDGEKIT_TIMEOUT", help="Deadline of each verifier call, in seconds."
    )
_TARGET = typer.Option(None, "--target", help=TARGET_HELP)
_YES = typer.Option(
    False, "--yes", "-y", help="With --target and no --draft: draft with the smallest model of the target's "
    "tokenizer on this machine (without it, that model is only suggested)."
)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def note(message: str) -> None:
    """A diagnostic line on stderr, so stdout stays clean for --json."""
    typer.echo(message, err=True)


# Drafting policy options, shared by `generate` and `chat`.
DRAFTING_HELP = DRAFTING.help("How long each block is")
UPLOAD_HELP = (
    "Draft hidden states to the verifier: tokens (none), fh (all, with the block), sh (only the verifier's "
    "mismatch positions, one more exchange), auto (FH or SH each round by the latency model), rtt (FH when "
    "RTT > 10 ms, WISV's rule). Only the semantic mode reads them; the lossless modes' output does not change."
)


def registered(registry: Registry) -> Any:
    """An option's check that its value names a policy of `registry`, read when the command runs (a
    policy registered after the command line was built is one too)."""

    def check(value: str) -> str:
        if value not in registry:
            raise typer.BadParameter(f"{value!r} is none of {', '.join(registry.names())}")
        return value

    return check


_DRAFTING = typer.Option("auto", "--drafting", help=DRAFTING_HELP, metavar=DRAFTING.metavar(),
                         callback=registered(DRAFTING))
_PREDICTOR = typer.Option(
    None, "--predictor", help="An ONNX rejection predictor (default: the one shipped for the pair)."
)
_PREDICTOR_SCHEDULE = typer.Option(
    True, "--predictor-schedule/--no-predictor-schedule",
    help="Predictor drafting: follow the predictor's delay schedule (its threshold moves with what a round "
    "costs: the RTT and the verifier's step) or keep its one operating threshold.",
)
_MAX_WINDOW = typer.Option(
    8, "--max-window", min=1, max=64, help="Most tokens per block for predictor and p-min drafting."
)
_P_MIN = typer.Option(0.5, "--p-min", min=0.0, max=1.0, help="Confidence threshold of p-min drafting.")
_UPLOAD = typer.Option(None, "--upload", help=UPLOAD_HELP + " Default: tokens; auto with --mode semantic.")
MODE_HELP = (
    "greedy: exact target argmax; sample: lossless speculative sampling; semantic: lossy (WISV), the "
    "verifier's decision head accepts mismatches it judges harmless, more readily on a poor link "
    "(needs a verifier started with --semantic-head; uploads hidden states)."
)
_SEMANTIC_THRESHOLD = typer.Option(
    None, "--semantic-threshold", min=0.0, max=1.0,
    help="Semantic mode: reject a mismatch when the head's P(reject) exceeds this (0: as greedy, 1: accept "
    "every mismatch); default: the head's own operating threshold.",
)


def upload_for(upload: str | None, mode: str) -> str:
    """The upload a command asked for, or its default: hidden states where semantic mode needs them."""
    return upload or ("auto" if mode == "semantic" else "tokens")


def semantic_summary(stats, sep: str = ", ") -> str:  # GenerationStats
    """'<sep>N mismatches accepted (semantic, head HEAD, threshold T)' for a semantic generation, else ''."""
    if stats.mode != "semantic":
        return ""
    return (
        f"{sep}{stats.server.semantic_accepted} mismatches accepted (semantic, head {stats.semantic_head}, "
        f"threshold {stats.semantic_threshold:.3f})"
    )
# The sampler past the temperature (edgekit.Sampler: penalties, then temperature, then the truncations);
# unset options keep the command's defaults.
_TOP_K = typer.Option(None, "--top-k", min=0, help="Sample among the K likeliest tokens only (0: all).")
_TOP_P = typer.Option(
    None, "--top-p", min=0.0, max=1.0, help="Nucleus sampling: the fewest likeliest tokens whose probability reaches P."
)
_MIN_P = typer.Option(
    None, "--min-p", min=0.0, max=1.0, help="Drop tokens less likely than MIN_P times the likeliest (0: off)."
)
_REPEAT_PENALTY = typer.Option(
    None, "--repeat-penalty", "--repetition-penalty", min=0.0,
    help="Penalise tokens seen in the last --repeat-last-n tokens (1: off; 1.1 is llama.cpp's and Ollama's usual).",
)
_FREQUENCY_PENALTY = typer.Option(
    None, "--frequency-penalty", min=-2.0, max=2.0, help="Subtract this times a token's count in the window."
)
_PRESENCE_PENALTY = typer.Option(
    None, "--presence-penalty", min=-2.0, max=2.0, help="Subtract this from every token seen in the window."
)
_REPEAT_LAST_N = typer.Option(
    None, "--repeat-last-n", min=-1, help="Tokens of the context the penalties count (default 64; -1: all)."
)


def sampler_options(
    top_k: int | None, top_p: float | None, min_p: float | None, repeat_penalty: float | None,
    frequency_penalty: float | None, presence_penalty: float | None, repeat_last_n: int | None,
) -> dict[str, Any]:
    """The sampler options given on the command line, by GenerationConfig's names."""
    given = {"top_k": top_k, "top_p": top_p, "min_p": min_p, "repetition_penalty": repeat_penalty,
             "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
             "penalty_last_n": repeat_last_n}
    return {k: v for k, v in given.items() if v is not None}


_SLO_CLASS = typer.Option(
    None, "--slo-class",
    help="A token-speed class the verifier names (by default realtime 8, interactive 6, standard 4, relaxed 2 "
    "tok/s) for it to schedule this generation by; unset: best effort.",
)
_TARGET_SPEED = typer.Option(
    None, "--target-speed", min=0.01, help="The token speed (tok/s) to ask the verifier for; wins over --slo-class."
)
_HIDDEN_ENCODING = typer.Option("fp16", "--hidden-encoding", help="fp16, or int8 with a scale per row.")
_ON_DISCONNECT = typer.Option(
    None, "--on-disconnect",
    help="While no verifier answers: 'draft' keeps drafting ahead (shown as provisional text, verified when a "
    "verifier answers again), 'wait' only tries again, 'fail' stops at once (default wait, or "
    "EDGEKIT_ON_DISCONNECT).",
)
_PROACTIVE = typer.Option(
    False, "--proactive/--no-proactive",
    help="Draft the next block while one is being verified (kept when the verdict takes the whole block and the "
    "draft's guess of the next token; dropped otherwise). Lossless; pays where the round trip is long.",
)
_RETRY_FOR = typer.Option(
    None, "--retry-for", min=0.0,
    help="Seconds to keep trying through a verifier outage, reopening the session if the verifier lost it "
    "(default 60, or EDGEKIT_RETRY_FOR); 0: stop at the first failure.",
)
