"""`edgekit chat` as transcripts against fakes, and multi-turn KV reuse on the real pair."""

from __future__ import annotations

import asyncio
import json
from textwrap import dedent

import pytest
from _transcript import normalise, normalise_json, transcript
from typer.testing import CliRunner

from edgekit import AsyncEdgeClient, ChatTemplate, EdgeClient, GenerationConfig
from edgekit.cli import _connect as cli_client
from edgekit.cli.app import app
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_client, toy_verifier

runner = CliRunner()
WIDE = {"COLUMNS": "2000"}  # a console wide enough that the /stats table never wraps a cell


@pytest.fixture()
def fake_client(monkeypatch, tmp_path):
    """`edgekit chat` builds its client through this factory: give it fakes."""
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    made = []

    def build_client(*, pair, verifier, timeout, token, generation, announce=True, **_):
        client = toy_client(ToyLanguageModel(seed=9), generation=generation)
        made.append(client)
        return client

    monkeypatch.setattr(cli_client, "build_client", build_client)
    return made


def test_chat_transcript(fake_client, tmp_path):
    session = "\n".join(["hello there", "/set k 2", "/set mode wrong", "/stats", "/help", "another question", "/clear",
                         "/exit", "never sent"])
    result = runner.invoke(app, ["chat", "--pair", "gemma-270m", "-n", "12", "--greedy"], input=session + "\n",
                           env=WIDE)
    assert result.exit_code == 0 and result.stderr == "", result.output
    # the fake verifier simulates its link
    assert normalise(result.stdout) == dedent("""\
        iknwvfpgxsip
        [12 tokens · <tok/s> · acceptance 0.30 · AAL 0.86 · 7 rounds · finish: length]
        draft_k = 2
        cannot set mode: mode must be 'greedy', 'sample' or 'semantic', got 'wrong'
        ┏━┳━┳━┓
        ┃ ┃ last answer ┃ conversation ┃
        ┡━╇━╇━┩
        │ tokens │ 12 │ 12 │
        │ rounds │ 7 │ 7 │
        │ acceptance rate │ 0.300 │ 0.300 │
        │ accepted length (AAL, no bonus) │ 0.86 │ 0.86 │
        │ target passes per token │ 0.583 │ 0.583 │
        │ wasted draft tokens │ 14 │ 14 │
        │ tokens per second │ <tok/s> │ <tok/s> │
        │ time to first token │ <ms> │ │
        │ drafting per token │ <ms> │ │
        │ device │ <device load> │ │
        └─┴─┴─┘
        link: in-process · RTT <ms> (jitter <ms>) · up <Mbit/s> / down <Mbit/s> · loss 0.0% · numerics exact
        Type a message and press Enter. Commands:
          /help                 this text
          /stats                acceptance, accepted length, rounds, speed, link
          /set KEY VALUE        k (draft window), drafting (auto|fixed|predictor|p-min|latency), max_window,
                                p_min, upload (tokens|fh|sh|auto|rtt), mode (greedy|sample|semantic),
                                temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                                presence_penalty, repeat_last_n, max_tokens, seed
          /clear                start a new conversation (keeps the system prompt)
          /exit                 leave (or Ctrl-D); Ctrl-C stops the current answer
        iknwvfpgxsip
        [12 tokens · <tok/s> · acceptance 0.50 · AAL 0.86 · 7 rounds · finish: length]
        conversation cleared
        """)
    conv_client = fake_client[0]
    verifier = conv_client.transport
    # Both answers went through one session; /set k 2 capped later blocks at 2.
    assert len({b.session_id for b in verifier.verify_calls}) == 1
    assert max(len(b.draft_tokens) for b in verifier.verify_calls[-3:]) <= 2
    lines = (tmp_path / "chat_history.jsonl").read_text().splitlines()
    assert [json.loads(line)["role"] for line in lines] == ["user", "assistant", "user", "assistant"]


def test_chat_json_prints_only_json(fake_client, tmp_path):
    result = runner.invoke(app, ["chat", "--json", "-n", "8", "--no-history", "--greedy"], input="one\ntwo\n")
    assert result.exit_code == 0 and result.stderr == "", result.output
    lines = result.stdout.splitlines(keepends=True)  # a JSON document a line, each printed here with an indent
    assert "".join(normalise_json(line) for line in lines) == transcript("chat-json-toy.txt")
    assert not (tmp_path / "chat_history.jsonl").exists()


def test_chat_prompt_answers_once(fake_client):
    result = runner.invoke(app, ["chat", "--prompt", "just once", "-n", "5", "--no-history", "--greedy"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert normalise(result.stdout) == (
        "iknwv\n[5 tokens · <tok/s> · acceptance 0.60 · AAL 1.50 · 2 rounds · finish: length]\n"
    )


def test_chat_samples_by_default_and_names_its_sampler(fake_client):
    result = runner.invoke(app, ["chat", "--json", "-n", "8", "--no-history", "--seed", "3"], input="one\n")
    assert result.exit_code == 0 and result.stderr == "", result.output
    answer = json.loads(result.stdout)
    defaults = {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1,
                "frequency_penalty": 0.0, "presence_penalty": 0.0, "penalty_last_n": 64}
    assert answer["sampler"] == defaults and answer["metrics"]["sampler"] == defaults
    assert answer["metrics"]["mode"] == "sample"
    # the verifier was asked to sample the target with the same settings
    opened = fake_client[0].transport.open_calls[-1]
    assert opened.mode == "sample" and opened.sampler.describe() == defaults


def test_chat_takes_the_ggufs_recommended_sampler_and_options_win_over_it(fake_client, monkeypatch):
    from edgekit.testing import FakeDraftModel

    monkeypatch.setattr(FakeDraftModel, "sampling_defaults", lambda self: {"temperature": 1.0, "top_k": 20},
                        raising=False)
    args = ["chat", "--json", "-n", "4", "--no-history", "--top-p", "0.5"]
    result = runner.invoke(app, args, input="one\n/set repeat_penalty 1.3\ntwo\n")
    assert result.exit_code == 0 and result.stderr == "repetition_penalty = 1.3\n", result.output  # people's: stderr
    first, second = (json.loads(line)["sampler"] for line in result.stdout.splitlines())
    assert first == {"temperature": 1.0, "top_k": 20, "top_p": 0.5, "min_p": 0.05, "repetition_penalty": 1.1,
                     "frequency_penalty": 0.0, "presence_penalty": 0.0, "penalty_last_n": 64}
    assert second == {**first, "repetition_penalty": 1.3}
    assert fake_client[0].transport.open_calls[-1].sampler.repetition_penalty == 1.3  # a new verifier session


def test_chat_takes_the_targets_recommended_sampler_over_the_drafts(fake_client, monkeypatch):
    """Issue 52, item 3: the target's GGUF recommends the sampler that shapes the output; the verifier
    says it in the handshake and chat takes it over the draft's (it took the draft's before)."""
    from edgekit.testing import FakeDraftModel
    from edgekit.verifier import ToyEngine

    monkeypatch.setattr(FakeDraftModel, "sampling_defaults", lambda self: {"temperature": 1.0, "top_k": 20},
                        raising=False)
    monkeypatch.setattr(ToyEngine, "sampling_defaults", lambda self: {"temperature": 0.6, "top_k": 40})
    result = runner.invoke(app, ["chat", "--json", "-n", "4", "--no-history"], input="one\n")
    assert result.exit_code == 0, result.output
    sampler = json.loads(result.stdout)["sampler"]
    assert sampler["temperature"] == 0.6 and sampler["top_k"] == 40, sampler
    assert fake_client[0].server_info().recommended_sampling == {"temperature": 0.6, "top_k": 40}
    assert type(fake_client[0].server_info().recommended_sampling["top_k"]) is int  # a count, whole on the wire


def test_generate_takes_every_sampler_option_and_names_the_sampler(fake_client):
    args = ["generate", "-p", "x", "--mode", "sample", "-t", "0.9", "--top-k", "5", "--top-p", "0.8", "--min-p", "0.1",
            "--repeat-penalty", "1.2", "--frequency-penalty", "0.3", "--presence-penalty", "0.4", "--repeat-last-n",
            "16", "--seed", "1", "-n", "4", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["sampler"] == {"temperature": 0.9, "top_k": 5, "top_p": 0.8, "min_p": 0.1, "repetition_penalty": 1.2,
                              "frequency_penalty": 0.3, "presence_penalty": 0.4, "penalty_last_n": 16}
    assert fake_client[0].transport.open_calls[-1].sampler.describe() == out["sampler"]
    bad = runner.invoke(app, ["generate", "-p", "x", "--mode", "sample", "--top-p", "0"])
    assert bad.exit_code != 0 and "top_p" in str(bad.exception)


def test_greedy_chat_with_a_bad_option_says_which(fake_client):
    result = runner.invoke(app, ["chat", "--greedy", "--mode", "sample", "--prompt", "x", "--no-history"])
    assert result.exit_code != 0 and "--greedy" in result.output
    result = runner.invoke(app, ["chat", "--prompt", "x", "--no-history"], input="")
    assert result.exit_code == 0


def test_plain_template_extends_turn_by_turn():
    t = ChatTemplate(None)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " hello"}]
    assert t.render(history[:1], add_generation_prompt=True) == "User: hi\nAssistant:"
    assert t.reply_suffix(history[:1]) == "\n"
    assert t.next_turn(history, {"role": "user", "content": "more"}) == "User: more\nAssistant:"


def test_async_client_has_the_same_shape():
    async def main():
        target = ToyLanguageModel(seed=2)
        kwargs = dict(
            draft=FakeDraftModel(ToyLanguageModel(seed=2, noise=1.0)),
            generation=GenerationConfig(max_tokens=20, draft_k=3, stop_at_eos=False),
        )
        async with AsyncEdgeClient(toy_verifier(target), **kwargs) as client:
            seen = [ev.type async for ev in client.generate("async")]
            text = await client.generate("async").text()
            conv = await client.conversation()
            first = await conv.send("one").until_done()
            second = await conv.send("two").until_done()
            await conv.close()
        sync = EdgeClient(toy_verifier(target), **kwargs).generate("async").until_done()
        return seen, text, first, second, sync

    seen, text, first, second, sync = asyncio.run(main())
    assert seen[-1] == "final" and "round" in seen and "text" in seen
    assert text == sync.text
    assert first.stats.completion_tokens == 20 and second.stats.completion_tokens == 20


def test_a_reply_stopped_early_still_counts_in_the_figures():
    client = toy_client(ToyLanguageModel(seed=4), max_tokens=200, draft_k=3, stop_at_eos=False)
    conv = client.conversation()
    with conv.send("stop me") as stream:
        for i, event in enumerate(stream):
            if event.type == "round" and i > 6:
                break
    stats = conv.last_stats
    assert stats.finish_reason == "stopped" and 0 < stats.completion_tokens < 200 and stats.rounds >= 2
    assert conv.messages[-1]["role"] == "assistant" and conv.messages[-1]["content"]
    follow = conv.send("go on").until_done()  # the session is still consistent
    assert follow.stats.completion_tokens == 200 and len(conv.totals) == 2


def test_on_a_terminal_an_answer_streams_as_rendered_markdown():
    from io import StringIO

    from rich.console import Console

    from edgekit.cli.chat import _MarkdownAnswer

    out = Console(file=StringIO(), force_terminal=True, width=60, record=True)
    with _MarkdownAnswer(out) as shown:
        for piece in ["Here:\n\n```py", "thon\ndef add(a, b):\n", "    return a + b\n```\n", "Done **now**."]:
            shown.add(piece)
        shown.provisional(" and drafted ahead")  # shown dimmed, then taken back: never confirmed
    text = out.export_text()
    assert "def add(a, b):" in text and "return a + b" in text and "Done now." in text
    assert "```" not in text and "**" not in text  # rendered, not raw
    assert text.rstrip().endswith("Done now.")  # the provisional text is gone from the final frame
