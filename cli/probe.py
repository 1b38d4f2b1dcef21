"""`edgekit probe HOST:PORT`: the measured link, and the upload and window the policy would choose."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from ._common import _DRAFT, _INSECURE, _TOKEN, note, print_json, timeout_option

if TYPE_CHECKING:
    from edgekit import ClientConfig, DraftModel, GenerationConfig
    from edgekit.link import LinkEstimator, LinkPolicy
    from edgekit.transport import VerifierTransport

# Drafted on to measure acceptance, draft and verification time (a short, ordinary code prompt).
CALIBRATION_PROMPT = "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n"


def probe(
    address: str = typer.Argument(..., help="Verifier: HOST:PORT, grpc://, grpcs://, openai+http://, sglang+http://, trtllm+http://."),
    pair: str | None = typer.Option(
        None, "--pair", help="Draft/target pair from the model registry; default: the one whose target the verifier "
        "serves (it is asked; stock servers need --pair)."
    ),
    draft: str | None = _DRAFT,
    pings: int = typer.Option(10, "--pings", min=1, help="Empty pings for the RTT."),
    tries: int = typer.Option(3, "--tries", min=1, help="Payload pings each way for the rates (the fastest counts)."),
    payload_kib: int = typer.Option(64, "--payload-kib", min=1, help="Payload of a rate ping, KiB."),
    link_only: bool = typer.Option(
        False, "--link-only", help="Only ping: no draft model, no calibration rounds (costs are then the defaults)."
    ),
    calibration_tokens: int = typer.Option(48, "--calibration-tokens", min=8, help="Tokens drafted to measure costs."),
    max_window: int = typer.Option(8, "--max-window", min=1, max=64, help="Longest window the policy may choose."),
    hidden_encoding: str = typer.Option("fp16", "--hidden-encoding", help="fp16 or int8."),
    token: str | None = _TOKEN,
    insecure: bool = _INSECURE,
    timeout: float = timeout_option(5.0),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Also draw the time per token of each window and upload "
                                     "into this PNG (needs the bench extra: matplotlib)."),
) -> None:
    """Measure the link to a verifier (RTT, jitter, rates, loss) and show the upload (FH or SH) and the
    draft window the latency model would choose, next to WISV's fixed rule (FH when RTT > 10 ms)."""
    from dataclasses import replace

    from edgekit import ClientConfig, GenerationConfig
    from edgekit.config import HiddenEncoding
    from edgekit.errors import ConfigError
    from edgekit.link import LinkEstimator, LinkPolicy
    from edgekit.link import probe as probe_link
    from edgekit.models import get_pair
    from edgekit.transport import connect, needs_tokenizer

    if pair is not None:
        get_pair(pair)  # an unknown pair is said before anything is sent
    stock = needs_tokenizer(address)
    if pair is None and draft is None and stock:
        raise ConfigError("a stock server (openai+http://, sglang+http://, trtllm+http://) cannot say which target "
                          "it serves before a draft is loaded: name the draft with --draft, or the pair with --pair")
    gen = GenerationConfig(
        max_tokens=calibration_tokens, drafting="latency", max_window=max_window, upload="auto",
        hidden_encoding=cast(HiddenEncoding, hidden_encoding), stop_at_eos=False,
    )
    config = ClientConfig.from_env(timeout=timeout, connect_timeout=timeout, token=token, insecure=insecure)
    link = LinkEstimator()
    if stock:
        # a stock server: its transport needs the draft's tokenizer even to ping
        from edgekit import LlamaDraftModel
        from edgekit.models.refs import resolve_for_use

        resolved = resolve_for_use(draft if draft is not None else get_pair(pair or "").draft, role="draft")
        # calibration drafts on it too: room for its prompt, its tokens and a window
        tokenizer = LlamaDraftModel(resolved.path, name=resolved.name, n_ctx=256 + calibration_tokens + max_window)
    else:
        tokenizer = None
    transport = connect(address, config, tokenizer)
    if tokenizer is not None:
        gen = replace(gen, upload="tokens")  # stock servers take no hidden states
    try:
        measured = probe_link(transport, link, pings=pings, tries=tries, payload_bytes=payload_kib * 1024)
        if pair is None and draft is None:  # the draft follows the verifier: ask which target it serves
            from edgekit.client import discover_pair

            pair, info = discover_pair(transport)
            note(f"the verifier serves {info.target_model}: probing with {pair}")
        pair = pair or "gemma-270m"  # with --draft, only for the defaults a pair gives
        hidden_size, n_vocab = _draft_shape(draft if draft is not None else get_pair(pair).draft)
        calibration = None
        if link_only:
            policy = LinkPolicy(gen, link, hidden_dim=hidden_size, n_vocab=n_vocab)
        else:
            policy, calibration = _calibrate(transport, link, pair, gen, config, tokenizer or draft)
    finally:
        transport.close()
        if tokenizer is not None:
            tokenizer.close()
    state = measured.link if link_only else link.state()
    model = policy.model()
    plan = policy.plan(max_window)
    rule = "fh" if state.rtt_ms > gen.rtt_rule_ms else "sh"
    windows = [
        {
            "window": k,
            "fh_round_ms": model.round_ms(k, "fh"),
            "sh_round_ms": model.round_ms(k, "sh"),
            "fh_ms_per_token": model.per_token_ms(k, "fh"),
            "sh_ms_per_token": model.per_token_ms(k, "sh"),
        }
        for k in range(1, max_window + 1)
    ]
    costs = policy.costs
    a, b = costs.verify_line()
    result = {
        "verifier": transport.address,
        "pair": pair,
        "link": state.__dict__ | {"pings": measured.pings, "probe_seconds": measured.seconds},
        "costs": {
            "measured": calibration is not None,
            "draft_step_ms": costs.draft_step_ms,
            "verify_ms": {"base": a, "per_token": b},
            "acceptance": costs.acceptance,
            "mismatch_density": costs.mismatch_density,
            "hidden_size": hidden_size,
            "hidden_encoding": hidden_encoding,
        },
        "choice": {
            "upload": plan.upload,
            "window": plan.window,
            "round_ms": plan.expected_ms,
            "ms_per_token": plan.per_token_ms,
            "rtt_rule_upload": rule,
            "rtt_rule_ms_per_token": model.per_token_ms(plan.window, rule),
        },
        "windows": windows,
    }
    if calibration is not None:
        result["calibration"] = calibration
    if plot is not None:
        note(f"figure: {_plot_windows(result, plot)}")
    if json_out:
        print_json(result)
        return
    _print(result)


def _draft_shape(ref: str) -> tuple[int, int]:
    """A draft's hidden size and vocabulary, from the registry or its GGUF header (no weights loaded)."""
    from edgekit.models import get_model, list_models

    if ref in {m.name for m in list_models()}:
        spec = get_model(ref)
        return spec.hidden_size, spec.vocab_size
    from edgekit.models.refs import resolve_for_use
    from edgekit.runtime import read_metadata

    path = resolve_for_use(ref, role="draft").path
    arch = read_metadata(path, ["general.architecture"])["general.architecture"]
    meta = read_metadata(path, [f"{arch}.embedding_length", "tokenizer.ggml.tokens"])
    tokens = meta["tokenizer.ggml.tokens"]
    hidden = meta[f"{arch}.embedding_length"]
    assert isinstance(hidden, int)
    return hidden, int(getattr(tokens, "length", 0))


def _calibrate(
    transport: VerifierTransport,
    link: LinkEstimator,
    pair: str,
    gen: GenerationConfig,
    config: ClientConfig,
    draft: DraftModel | str | None = None,
) -> tuple[LinkPolicy, dict]:
    """A short real generation through the verifier, so the costs are this device's and this verifier's
    (on `draft` when one is loaded already, else the pair's, loaded here). It runs on the link just
    probed: the session measures nothing twice, and its rounds keep the estimate current."""
    from edgekit import EdgeClient, FinalStats

    with EdgeClient(transport, pair=pair, draft=draft, config=config, generation=gen) as client:
        client.link = link
        session = client.session()
        try:
            session.open(client.tokenize(CALIBRATION_PROMPT))
            final = [ev for ev in session.stream() if isinstance(ev, FinalStats)][-1]
        finally:
            session.close()
    s = final.stats
    return session.policy, {
        "rounds": s.rounds,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "uploads": s.uploads,
        "exchanges": s.exchanges,
        "uplink_bytes": s.uplink_bytes,
        "downlink_bytes": s.downlink_bytes,
    }


def _plot_windows(r: dict, path: Path) -> Path:
    """Time per committed token against the window, for FH and SH, with the choice marked."""
    from ._plot import figure, save

    fig, (ax,) = figure()
    ks = [w["window"] for w in r["windows"]]
    ax.plot(ks, [w["fh_ms_per_token"] for w in r["windows"]], marker="o", label="FH: hidden states with the block")
    ax.plot(ks, [w["sh_ms_per_token"] for w in r["windows"]], marker="s", label="SH: only those asked for")
    choice = r["choice"]
    ax.scatter([choice["window"]], [choice["ms_per_token"]], s=160, facecolors="none", edgecolors="r", linewidths=2,
               label=f"the policy's choice: {choice['upload'].upper()}, window {choice['window']}", zorder=3)
    link = r["link"]
    ax.set_title(f"{r['verifier']} ({r['pair']}): RTT {link['rtt_ms']:.1f} ms, up {link['uplink_mbps']:.0f} / "
                 f"down {link['downlink_mbps']:.0f} Mbit/s", fontsize=9)
    ax.set_xlabel("draft window (tokens per block)")
    ax.set_ylabel("expected ms per committed token")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return save(fig, path)


def _print(r: dict) -> None:
    link, costs, choice = r["link"], r["costs"], r["choice"]
    typer.echo(f"verifier {r['verifier']} ({link['pings']} pings, {link['probe_seconds']:.2f} s)")
    typer.echo(
        f"  RTT {link['rtt_ms']:.2f} ms (jitter {link['rtt_jitter_ms']:.2f}), uplink {_rate(link['uplink_mbps'])}, "
        f"downlink {_rate(link['downlink_mbps'])}, loss {100 * link['loss_rate']:.1f}%"
    )
    source = "measured in a short generation" if costs["measured"] else "defaults (--link-only)"
    v = costs["verify_ms"]
    typer.echo(
        f"  costs ({source}): draft {costs['draft_step_ms']:.2f} ms/step, verify {v['base']:.1f} + "
        f"{v['per_token']:.2f} ms/token, acceptance {costs['acceptance']:.2f}"
    )
    typer.echo("  window   FH ms/token   SH ms/token")
    for w in r["windows"]:
        mark = "  <" if w["window"] == choice["window"] else ""
        typer.echo(f"  {w['window']:>6}   {w['fh_ms_per_token']:>11.2f}   {w['sh_ms_per_token']:>11.2f}{mark}")
    typer.echo(
        f"policy: {choice['upload'].upper()} with a window of {choice['window']} "
        f"({choice['ms_per_token']:.2f} ms per committed token); the 10 ms RTT rule would send "
        f"{choice['rtt_rule_upload'].upper()} ({choice['rtt_rule_ms_per_token']:.2f} ms)"
    )
    if not costs["measured"]:
        note("costs are defaults; drop --link-only to measure them on this device and verifier")


def _rate(mbps: float) -> str:
    # 0 means a payload took no measurable time beyond an empty ping (loopback, or a fast LAN)
    return f"{mbps:.1f} Mbit/s" if mbps > 0 else "too fast to time (rate ignored)"
