"""Which registered pair fits a verifier: asked of the verifier, before any draft is loaded.

A handshake with no tokenizer (`Fingerprint.unknown()`) only asks which target the verifier
serves. The pair is the registered one with that target; failing that, one whose draft (in
the cache) shares the target's tokenizer, read from the draft's vocabulary alone.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, IncompatibleModelsError, ModelError, VerifierUnavailableError
from ..protocol import Fingerprint, ServerInfo
from ..transport import VerifierTransport

__all__ = ["check_remote_draft", "discover_pair"]


def discover_pair(transport: VerifierTransport) -> tuple[str, ServerInfo]:
    """The name of the registered pair for the verifier behind `transport`, and what it said."""
    from ..models import is_present, list_pairs, model_path, pair_for_target

    info = _ask(transport)
    try:
        return pair_for_target(info.target_model).name, info
    except ConfigError:
        pass
    if info.target_fingerprint.vocab_size == 0:  # a stock server's transport: it publishes no tokenizer
        raise ConfigError(
            f"the verifier at {transport.address} serves {info.target_model!r}, which no registered pair has as "
            "its target, and publishes no tokenizer to compare drafts with; name the pair (pair=..., --pair)"
        )
    from ..runtime import LlamaModel

    sharing = []
    for pair in list_pairs():
        if not is_present(pair.draft):
            continue
        try:
            vocab = LlamaModel(model_path(pair.draft), name=pair.draft, vocab_only=True)
        except ModelError:  # a damaged file in the cache is not this verifier's match
            continue
        try:
            if vocab.fingerprint().same_tokenizer(info.target_fingerprint):
                sharing.append(pair.draft)
        finally:
            vocab.close()
    return pair_for_target(info.target_model, drafts_sharing_tokenizer=sharing).name, info


def check_remote_draft(transport: VerifierTransport, path: Path, name: str) -> None:
    """Refuses a draft file whose tokenizer is not the verifier's target's, from the draft's
    vocabulary alone (no weights loaded) and the verifier's answer to a handshake without a
    tokenizer. A verifier that cannot be asked now (unreachable, or from before target discovery)
    is left to the session's handshake, which checks the same."""
    from ..runtime import LlamaModel

    try:
        info = _ask(transport)
    except (VerifierUnavailableError, ConfigError):
        return
    theirs = info.target_fingerprint
    if theirs.vocab_size == 0:  # publishes no tokenizer
        return
    vocab = LlamaModel(path, name=name, vocab_only=True)
    try:
        ours = vocab.fingerprint()
    finally:
        vocab.close()
    if not ours.same_tokenizer(theirs):
        what = ("their vocabularies differ" if (ours.vocab_size - ours.padding) != (theirs.vocab_size - theirs.padding)
                else "the same number of tokens, but different tokens or special tokens")
        raise IncompatibleModelsError(
            f"draft model {name!r} ({ours.vocab_size} tokens) does not share a tokenizer with the target "
            f"{info.target_model!r} ({theirs.vocab_size} tokens) the verifier at {transport.address} serves: {what}; "
            "use a draft of the target's family (checked before loading the draft's weights)"
        )


def _ask(transport: VerifierTransport) -> ServerInfo:
    """The handshake without a tokenizer, on each verifier of a failover set in turn."""
    attempts = max(1, len(getattr(transport, "transports", ())))
    for attempt in range(attempts):
        try:
            return transport.handshake(Fingerprint.unknown(), draft_model="", draft_hidden_size=0)
        except VerifierUnavailableError:
            if attempt == attempts - 1:
                raise
        except IncompatibleModelsError:  # it checked the empty fingerprint: it predates target discovery
            raise ConfigError(
                f"the verifier at {transport.address} does not say which target it serves (it predates this "
                "edgekit); name the pair (pair=..., --pair)"
            ) from None
    raise AssertionError("unreachable")
