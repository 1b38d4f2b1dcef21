"""The draft follows the verifier: with no pair named, the client asks the verifier which target
it serves (a handshake with no tokenizer, which opens nothing) and drafts with that target's pair."""

from __future__ import annotations

import pytest

from edgekit import ConfigError, EdgeClient
from edgekit.client import discover_pair
from edgekit.errors import IncompatibleModelsError
from edgekit.protocol import Fingerprint
from edgekit.testing import ToyLanguageModel, toy_verifier


def test_a_handshake_with_no_tokenizer_only_says_which_target_it_is():
    transport = toy_verifier(ToyLanguageModel(seed=1, name="qwen2.5-coder-1.5b-instruct"))
    info = transport.handshake(Fingerprint.unknown(), draft_model="", draft_hidden_size=0)
    assert info.target_model == "qwen2.5-coder-1.5b-instruct" and info.target_fingerprint.vocab_size > 0
    assert discover_pair(transport)[0] == "qwen-coder"
    with pytest.raises(IncompatibleModelsError):  # a real draft of another family is still refused
        transport.handshake(Fingerprint(5, b"x" * 32, 0, 1, "other"), draft_model="other", draft_hidden_size=8)


def test_a_verifier_of_an_unregistered_target_is_an_error_naming_the_pairs():
    transport = toy_verifier(ToyLanguageModel(seed=1, name="mystery-7b"))
    with pytest.raises(ConfigError, match=r"serves 'mystery-7b'.*gemma-270m \(target gemma-3-270m"):
        EdgeClient(transport)


def test_a_verifier_that_predates_discovery_asks_for_the_pair_to_be_named():
    class OldVerifier:  # checks every fingerprint, the empty one too
        address = "old:1"

        def handshake(self, draft, **_):
            raise IncompatibleModelsError("draft model (unnamed) does not share a tokenizer with target model 'x'")

    with pytest.raises(ConfigError, match="predates this edgekit\\); name the pair"):
        discover_pair(OldVerifier())  # type: ignore[arg-type]
