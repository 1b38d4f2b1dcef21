"""Which registered pair fits a verifier: asked of the verifier, before any draft is loaded.

A handshake with no tokenizer (`Fingerprint.unknown()`) only asks which target the verifier
serves. The pair is the registered one with that target; failing that, one whose draft (in
the cache) shares the target's tokenizer, read from the draft's vocabulary alone.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..protocol import Fingerprint, ServerInfo
from ..transport import VerifierTransport

__all__ = ["discover_pair"]


def discover_pair(transport: VerifierTransport) -> tuple[str, ServerInfo]:
    """The name of the registered pair for the verifier behind `transport`, and what it said."""
    from ..models import is_present, list_pairs, model_path, pair_for_target

    info = transport.handshake(Fingerprint.unknown(), draft_model="", draft_hidden_size=0)
    try:
        return pair_for_target(info.target_model).name, info
    except ConfigError:
        pass
    from ..runtime import LlamaModel

    sharing = []
    for pair in list_pairs():
        if is_present(pair.draft):
            vocab = LlamaModel(model_path(pair.draft), name=pair.draft, vocab_only=True)
            try:
                if vocab.fingerprint().same_tokenizer(info.target_fingerprint):
                    sharing.append(pair.draft)
            finally:
                vocab.close()
    return pair_for_target(info.target_model, drafts_sharing_tokenizer=sharing).name, info
