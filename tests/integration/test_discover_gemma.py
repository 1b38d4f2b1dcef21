"""The draft follows the verifier: with no pair named, the client asks the verifier which target
it serves (a handshake with no tokenizer, which opens nothing) and drafts with that target's pair."""

from __future__ import annotations

import json

from _transcript import edgekit

from edgekit import EdgeClient


def test_the_sdk_and_generate_draft_with_the_pair_of_the_verifier(gemma_server):
    with EdgeClient(gemma_server.address) as client:
        assert client.pair == "gemma-270m" and client.draft.name == "gemma-3-270m-q4_0"
        assert len(client.generate("def add(a, b):", max_tokens=8).until_done().token_ids) == 8
    r = edgekit("generate", "--verifier", gemma_server.address, "--prompt", "Hello", "--max-tokens", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pair"] == "gemma-270m"


def test_discovery_fails_over_to_the_next_verifier(gemma_server):
    with EdgeClient(f"127.0.0.1:9,{gemma_server.address}") as client:  # nothing listens on port 9
        assert client.pair == "gemma-270m"
