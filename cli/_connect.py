"""Building the client a command talks through (one place, so tests can swap in fakes)."""

from __future__ import annotations

from ._common import note


def build_client(
    *,
    pair: str | None,
    verifier: str | None,
    draft: str | None = None,  # a model reference (edgekit.models.refs); None: the pair's
    target: str | None = None,  # the local verifier's model, by reference; None: the pair's
    timeout: float,
    token: str | None,
    insecure: bool = False,  # a token over plaintext to another machine (--insecure)
    generation,  # GenerationConfig
    announce: bool = True,
    local_server=None,  # ServerConfig of the local verifier, when one is started
    retry_for: float | None = None,  # None: the config's (EDGEKIT_RETRY_FOR, or 60 s)
    on_disconnect: str | None = None,  # None: the config's (EDGEKIT_ON_DISCONNECT, or "wait")
    yes: bool = False,  # with a target and no draft: draft with the smallest model of its tokenizer here
):
    from edgekit import ClientConfig, EdgeClient

    if target is not None and draft is None and verifier is None:
        draft = _draft_for(target, yes=yes, announce=announce)
    retry: dict = {} if retry_for is None else {"retry_for": retry_for}
    if on_disconnect is not None:
        retry["on_disconnect"] = on_disconnect
    config = ClientConfig.from_env(
        timeout=timeout, connect_timeout=min(10.0, timeout), token=token, insecure=insecure, **retry
    )
    # pair None with a verifier: the pair whose target it serves (EdgeClient asks it)
    client = EdgeClient(
        verifier, pair=pair, draft=draft, target=target, config=config, generation=generation,
        local_server=local_server,
    )
    try:
        if client.local_verifier_address and announce:
            info = client.server_info()
            numerics = "exact numerics" if info.exact_numerics else "fast numerics"
            what = client.pair if draft is None and target is None else f"the draft {client.draft.name}"
            note(f"started a local verifier for {what} on {client.local_verifier_address} "
                 f"({info.target_model}, {numerics})")
        elif pair is None and draft is None and announce:
            note(f"the verifier serves {client.server_info().target_model}: drafting with {client.pair}")
    except BaseException:
        client.close()  # the caller's `with` has not begun: nothing else would stop its verifier or free its draft
        raise
    return client


def _draft_for(target: str, *, yes: bool, announce: bool) -> str:
    """The draft for a target named without one: the smallest model of its tokenizer on this machine
    (every source), used with --yes, else suggested in the error."""
    from edgekit.errors import ConfigError
    from edgekit.models.inventory import smallest_draft_for
    from edgekit.models.refs import resolve_for_use

    resolved = resolve_for_use(target, role="target")
    found = smallest_draft_for(resolved.path)
    if found is None:
        raise ConfigError(
            f"no --draft given, and no smaller model of {resolved.name}'s tokenizer is on this machine "
            "(edgekit models list shows what is); name one with --draft, e.g. a smaller quant or size of the "
            "same family on the Hub: --draft hf:ORG/REPO:QUANT"
        )
    if not yes:
        raise ConfigError(
            f"no --draft given: {found.ref} ({found.size / 1e6:.0f} MB) is the smallest model of {resolved.name}'s "
            f"tokenizer on this machine; pass --draft {found.ref}, or --yes to draft with it"
        )
    if announce:
        note(f"drafting with {found.ref}, the smallest model of {resolved.name}'s tokenizer on this machine")
    return found.ref
