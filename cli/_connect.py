"""Building the client a command talks through (one place, so tests can swap in fakes)."""

from __future__ import annotations

from ._common import note


def build_client(
    *,
    pair: str | None,
    verifier: str | None,
    timeout: float,
    token: str | None,
    generation,  # GenerationConfig
    announce: bool = True,
    local_server=None,  # ServerConfig of the local verifier, when one is started
    retry_for: float | None = None,  # None: the config's (EDGEKIT_RETRY_FOR, or 60 s)
    on_disconnect: str | None = None,  # None: the config's (EDGEKIT_ON_DISCONNECT, or "wait")
):
    from edgekit import ClientConfig, EdgeClient

    retry: dict = {} if retry_for is None else {"retry_for": retry_for}
    if on_disconnect is not None:
        retry["on_disconnect"] = on_disconnect
    config = ClientConfig.from_env(timeout=timeout, connect_timeout=min(10.0, timeout), token=token, **retry)
    # pair None with a verifier: the pair whose target it serves (EdgeClient asks it)
    client = EdgeClient(verifier, pair=pair, config=config, generation=generation, local_server=local_server)
    try:
        if client.local_verifier_address and announce:
            info = client.server_info()
            numerics = "exact numerics" if info.exact_numerics else "fast numerics"
            note(f"started a local verifier for {client.pair} on {client.local_verifier_address} "
                 f"({info.target_model}, {numerics})")
        elif pair is None and announce:
            note(f"the verifier serves {client.server_info().target_model}: drafting with {client.pair}")
    except BaseException:
        client.close()  # the caller's `with` has not begun: nothing else would stop its verifier or free its draft
        raise
    return client
