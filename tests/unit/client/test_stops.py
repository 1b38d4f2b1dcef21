"""Stop strings and stop tokens are part of the generation (issue 53, item 2): the client cuts its
output at the first stop string whichever way it was generated (rounds or the target-only stream),
holding back text that may begin one with the tokens it belongs to, and sends its stop tokens to
the verifier's target-only stream (the wire's `stop_tokens`). The API layer keeps no count of its
own: what it returns is the generation's."""

from __future__ import annotations

import pytest

from edgekit import ConfigError, GenerationConfig, GenerationStats, TextDelta
from edgekit.client import FinalStats, TextDecoder
from edgekit.client._accumulator import StatsAccumulator
from edgekit.errors import EdgekitError
from edgekit.protocol import GenerateRequest
from edgekit.runtime import ToyLanguageModel
from edgekit.testing import ScriptedTransport, toy_client, toy_verifier

TARGET = ToyLanguageModel(seed=5)


PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!", 9: "<stop>"}


class _Pieces:
    """A tokenizer of a few multi-character tokens (PIECES), for the accumulator alone."""

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return PIECES[token].encode()

    def is_eog(self, token: int) -> bool:
        return False


def _accumulator(**stops) -> StatsAccumulator:
    return StatsAccumulator(GenerationStats(mode="greedy", draft_k=0), TextDecoder(_Pieces()), **stops)  # type: ignore[arg-type]


def test_a_stop_string_cuts_the_text_before_it_and_its_tokens_never_run_ahead_of_the_text():
    acc = _accumulator(stop=("lo w",))
    first = acc.output([1])  # "Hel": its "l" may begin "lo w", so the token waits with its text
    assert (first.text, first.token_ids) == ("", ())
    second = acc.output([2])  # "Hello": "lo" may begin it; "Hel" is safe
    assert (second.text, second.token_ids) == ("Hel", (1,)) and not acc.stop_found
    third = acc.output([3, 4])  # "Hello world": the stop string, from the token "lo" on
    assert (third.text, third.token_ids) == ("", ()) and acc.stop_found
    assert acc.flush() is None
    final = acc.finish("stop")
    assert (final.text, final.token_ids, final.stats.completion_tokens) == ("Hel", (1,), 1)
    assert acc.produced == [1, 2, 3, 4]  # what the generation made, for its budget and its context


def test_a_token_the_stop_string_begins_inside_is_the_outputs_and_text_held_back_comes_out_at_the_end():
    acc = _accumulator(stop=("orl",))
    shown = [acc.output([t]) for t in (1, 2, 3)]  # "Hello wor": "or" held back with " wor"
    assert "".join(d.text for d in shown) == "Hello" and [t for d in shown for t in d.token_ids] == [1, 2]
    cut = acc.output([4])  # "Hello world": cut inside " wor", which begins before the stop string
    assert (cut.text, cut.token_ids, acc.stop_found) == (" w", (3,), True)

    acc = _accumulator(stop=("orl",))
    held = [acc.output([t]) for t in (1, 2, 3)]  # "Hello wor", and the answer ends there
    tail = acc.flush()  # no stop string after all: what was held back, with its token
    assert tail is not None and (tail.text, tail.token_ids) == (" wor", (3,)) and not acc.stop_found
    assert "".join(d.text for d in (*held, tail)) == acc.finish("length").text == "Hello wor"
    acc = _accumulator(stop=("orl",))
    more = [acc.output([t]) for t in (1, 2, 3, 5)]  # "Hello wor!": "!" shows " wor" begins no stop string
    assert more[-1].text == " wor!" and more[-1].token_ids == (3, 5) and acc.flush() is None


def test_a_stop_token_ends_the_output_with_no_text_of_its_own():
    acc = _accumulator(stop_tokens=(9,))
    delta = acc.output([1, 2, 9])
    assert (delta.text, delta.token_ids) == ("Hello", (1, 2, 9))


def test_the_config_takes_stop_strings_and_tokens_and_refuses_what_cannot_stop():
    assert GenerationConfig(stop="\n").stop == ("\n",)
    assert GenerationConfig(stop=["a", "b"], stop_tokens=[3]).stop_tokens == (3,)  # type: ignore[arg-type]
    for bad in (dict(stop=[""]), dict(stop=["x"] * 65), dict(stop_tokens=(-1,))):
        with pytest.raises(ConfigError, match="stop"):
            GenerationConfig(**bad)  # type: ignore[arg-type]


def _text(client, tokens) -> str:
    return b"".join(client.draft.token_bytes(t) for t in tokens).decode()


def _run(stream) -> tuple[FinalStats, list[TextDelta]]:
    deltas, final = [], None
    for ev in stream:
        if isinstance(ev, TextDelta):
            deltas.append(ev)
        elif isinstance(ev, FinalStats):
            final = ev
    assert final is not None
    return final, deltas


@pytest.mark.parametrize("route", ["speculative", "target-only"])
def test_a_stop_string_ends_a_generation_by_either_route_as_it_ends_the_text(route):
    with toy_client(TARGET, noise=1.0, max_tokens=60, draft_k=4, stop_at_eos=False, drafting="fixed") as client:
        generate = client.generate if route == "speculative" else client.generate_target_only
        full, _ = _run(generate("abc"))
        for stop in (full.text[10:13], full.text[29:30], "never in a toy's text: it has no capitals"):
            cut, deltas = _run(generate("abc", stop=[stop]))
            end = full.text.find(stop)
            if end < 0:
                assert (cut.text, cut.token_ids, cut.stats.finish_reason) == (full.text, full.token_ids, "length")
                continue
            assert cut.text == full.text[:end] and cut.stats.finish_reason == "stop"
            # the output's tokens: those whose text begins before the stop string (a toy token's text
            # is a character, or none: its beginning of text)
            kept = tuple(t for i, t in enumerate(full.token_ids) if len(_text(client, full.token_ids[:i])) < end)
            assert cut.token_ids == kept and cut.stats.completion_tokens == len(kept) < len(full.token_ids)
            assert "".join(d.text for d in deltas) == cut.text
            assert tuple(t for d in deltas for t in d.token_ids) == cut.token_ids


@pytest.mark.parametrize("route", ["speculative", "target-only"])
def test_stop_tokens_end_a_generation_and_travel_to_the_verifiers_stream(route):
    verifier = ScriptedTransport(toy_verifier(TARGET))
    with toy_client(TARGET, noise=1.0, verifier=verifier, max_tokens=60, draft_k=4, stop_at_eos=False,
                    drafting="fixed") as client:
        generate = client.generate if route == "speculative" else client.generate_target_only
        full, _ = _run(generate("abc"))
        stop = full.token_ids[12]
        at = full.token_ids.index(stop)
        cut, _ = _run(generate("abc", stop_tokens=[stop]))
        assert cut.token_ids == full.token_ids[: at + 1] and cut.text == _text(client, full.token_ids[:at])
    assert cut.stats.finish_reason == "stop"
    asked = [c.arguments["request"] for c in verifier.calls if c.method == "generate"]
    assert len(asked) == (0 if route == "speculative" else 2) and all(isinstance(r, GenerateRequest) for r in asked)
    if asked:
        assert tuple(asked[-1].stop_tokens) == (stop,)  # the verifier stopped the stream there itself


def test_the_verifier_refuses_stop_tokens_outside_its_vocabulary():
    verifier = toy_verifier(TARGET)
    request = GenerateRequest((3, 4, 5), "greedy", seed=0, max_tokens=4, stop_tokens=(TARGET.vocab_size + 7,))
    with pytest.raises(EdgekitError, match="stop_tokens"):
        list(verifier.generate(request))


def test_edgekit_generate_stops_at_each_stop_option_and_says_so(monkeypatch):
    import json

    from typer.testing import CliRunner

    from edgekit.cli import _connect  # private: where the CLI builds its client, swapped for a toy one
    from edgekit.cli.app import app

    def build_client(*, generation, **_):
        return toy_client(TARGET, noise=1.0, max_tokens=generation.max_tokens, draft_k=4, stop_at_eos=False,
                          drafting="fixed", stop=generation.stop)

    monkeypatch.setattr(_connect, "build_client", build_client)
    runner = CliRunner()

    def generate(*options: str) -> dict:
        r = runner.invoke(app, ["generate", "--prompt", "abc", "-n", "60", "--json", *options])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    full = generate()
    first, second = full["text"][29:31], full["text"][10:12]
    cut = generate("--stop", first, "--stop", second)
    assert cut["stop"] == [first, second] and cut["finish_reason"] == "stop"
    assert cut["text"] == full["text"][: min(full["text"].find(first), full["text"].find(second))]
    assert full["finish_reason"] == "length" and full["stop"] == []


def test_a_conversation_goes_on_from_the_reply_its_stop_string_cut_not_from_what_was_generated():
    from edgekit.testing import FakeDraftModel

    target = ToyLanguageModel(seed=5)
    verifier = toy_verifier(target)
    with toy_client(target, draft=FakeDraftModel(target), verifier=verifier, max_tokens=60, draft_k=4,
                    stop_at_eos=False, drafting="fixed") as client:
        full = client.conversation().send("abc").until_done()
        stop = full.text[20:23]
        conv = client.conversation(stop=[stop])
        cut = conv.send("abc").until_done()
        assert cut.stats.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]
        # the round that found the stop string committed tokens past it: that session is given up
        kept = None if conv.session is None else len(conv.session.tokens)
        assert kept is None, f"the session kept {kept} tokens, past the cut"
        opened = len(verifier.open_calls)
        conv.send("more").until_done()
        # the next turn's session opens on the history as shown: the template over the cut reply
        (reopened,) = verifier.open_calls[opened:]
        shown = client.tokenize(client.chat_template().render(conv.messages[:-1], add_generation_prompt=True))
        assert list(reopened.prompt_tokens) == shown and conv.messages[1]["content"] == cut.text
