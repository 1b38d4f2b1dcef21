"""`edgekit chat` as transcripts against fakes, and multi-turn KV reuse on the real pair."""

from __future__ import annotations

from textwrap import dedent

import pytest
from _transcript import normalise
from typer.testing import CliRunner

from edgekit import EdgeClient, GenerationConfig
from edgekit.cli.app import app

runner = CliRunner()
WIDE = {"COLUMNS": "2000"}  # a console wide enough that the /stats table never wraps a cell


@pytest.mark.models
def test_second_turn_reuses_both_kv_caches(gemma_server, gemma_draft):
    """Turn 2 runs only its own tokens through either model, never turn 1's again."""
    with EdgeClient(
        gemma_server.address, draft=gemma_draft, generation=GenerationConfig(max_tokens=24)
    ) as client:
        system = "You are a helpful assistant. " * 20  # a long first turn, so re-reading it would show
        conv = client.conversation(system=system)
        conv.send("Tell me about the sea.").until_done()
        sid = conv.session.session_id
        committed_1 = len(conv.session.tokens)
        draft_1 = gemma_draft.decoded_tokens
        target_1 = gemma_server.service.sessions.get(sid).decoded
        second = conv.send("And about rivers?").until_done()
        assert conv.session.session_id == sid  # the same verifier session
        new_tokens = len(conv.session.tokens) - committed_1  # the user turn plus the reply
        draft_2 = gemma_draft.decoded_tokens - draft_1
        target_2 = gemma_server.service.sessions.get(sid).decoded - target_1
        assert committed_1 > 150
        # Each side decodes the new tokens plus, per round, its drafted block: never the history.
        assert draft_2 <= new_tokens + second.stats.drafted
        assert target_2 <= new_tokens + second.stats.drafted + second.stats.rounds
        assert draft_2 < committed_1 and target_2 < committed_1
        conv.close()


@pytest.mark.models
def test_chat_transcript_on_the_real_pair(gemma_server, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    result = runner.invoke(
        app,
        ["chat", "--pair", "gemma-270m", "--verifier", gemma_server.address, "-n", "16", "--greedy"],
        input="Name three colours.\n/stats\n/exit\n", env=WIDE,
    )
    assert result.exit_code == 0 and result.stderr == "", result.output
    # gemma's answer, and how many of the draft's tokens the target took, may differ on another CPU
    # (llama.cpp's numerics)
    gemma = [
        (r"\A(?s:.+?)\n(?=\[16 tokens · )", "<gemma's answer>\n"),
        (r"acceptance \d\.\d\d · AAL \d\.\d\d · \d+ rounds", "acceptance <gemma> · AAL <gemma> · <n> rounds"),
        (r"^│ (rounds|acceptance rate|accepted length \(AAL, no bonus\)|target passes per token|wasted draft tokens) "
         r"│ [\d.]+ │ [\d.]+ │$", r"│ \1 │ <gemma> │ <gemma> │"),
    ]
    assert normalise(result.stdout, {gemma_server.address: "<address>"}, gemma) == dedent("""\
        <gemma's answer>
        [16 tokens · <tok/s> · acceptance <gemma> · AAL <gemma> · <n> rounds · finish: length]
        ┏━┳━┳━┓
        ┃ ┃ last answer ┃ conversation ┃
        ┡━╇━╇━┩
        │ tokens │ 16 │ 16 │
        │ rounds │ <gemma> │ <gemma> │
        │ acceptance rate │ <gemma> │ <gemma> │
        │ accepted length (AAL, no bonus) │ <gemma> │ <gemma> │
        │ target passes per token │ <gemma> │ <gemma> │
        │ wasted draft tokens │ <gemma> │ <gemma> │
        │ tokens per second │ <tok/s> │ <tok/s> │
        │ time to first token │ <ms> │ │
        │ drafting per token │ <ms> │ │
        │ device │ <device load> │ │
        └─┴─┴─┘
        link: <address> · RTT <ms> (jitter <ms>) · up <Mbit/s> / down <Mbit/s> · loss 0.0% · numerics exact
        """)
