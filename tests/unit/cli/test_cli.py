"""CLI transcripts: what a person types and what they see."""

from __future__ import annotations

import re

import pytest
from _transcript import edgekit, normalise, normalise_json, transcript
from typer.testing import CliRunner

from edgekit.cli.app import app

runner = CliRunner()




def test_a_transcript_keeps_what_a_person_reads_and_makes_placeholders_of_what_varies():
    assert normalise("[12 tokens, 41.8 tok/s, 7 rounds, acceptance 0.30, finish: length]\n") == (
        "[12 tokens, <tok/s>, 7 rounds, acceptance 0.30, finish: length]\n"
    )
    assert normalise("  draft step   median    9033.8 us   p99  16880.6 us   2.94% of a step\n") == (
        "  draft step   median <us>   p99 <us> <%> of a step\n"
    )
    # an option's value and a default cost are no measurement
    kept = ("did not answer a ping within 2 s", "the 10 ms RTT rule would send SH (18.31 ms)",
            "draft 10.00 ms/step, verify 10.0 + 5.00 ms/token", "verifier at 127.0.0.1:9 is unavailable")
    assert [normalise(k) for k in kept] == [*kept[:1], "the 10 ms RTT rule would send SH (<ms>)", *kept[2:]]
    assert normalise("on 127.0.0.1:41585 (\x1b[2mexact\x1b[0m)  \n┃      ┃ last answer   ┃\n┏━━━━━┳━━━┓") == (
        "on 127.0.0.1:<port> (exact)\n┃ ┃ last answer ┃\n┏━┳━┓"
    )
    assert normalise("wrote /tmp/x/t.npz (0.3 s)", {"/tmp/x": "<tmp>"}) == "wrote <tmp>/t.npz (<s>)"
    doc = '{\n  "elapsed_s": 0.01,\n  "device": {\n    "cpu_percent": 97.1\n  },\n  "cpu_percent": 3\n}\n'
    assert normalise_json(doc, {"elapsed_s": "<s>", "device.cpu_percent": "<%>"}) == (
        '{\n  "elapsed_s": "<s>",\n  "device": {\n    "cpu_percent": "<%>"\n  },\n  "cpu_percent": 3\n}\n'
    )
    with pytest.raises(AssertionError, match="not one JSON document as the CLI prints it"):
        normalise_json('{"elapsed_s": 0.01}\n\n', {})


@pytest.mark.parametrize(
    "command",
    [[], ["generate"], ["serve"], ["models"], ["models", "pull"], ["predictor"], ["predictor", "collect"],
     ["predictor", "train"], ["profile"], ["chat"], ["probe"], ["plan"]],
)
def test_every_command_explains_its_options(command):
    # a console wide enough that no help wraps: one transcript line per option, whatever the terminal
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "2000"})
    assert result.exit_code == 0 and result.stderr == "", result.output
    expected = transcript(f"help/{'-'.join(['edgekit', *command])}.txt")
    # Every word in its order; the frame around them (rich's panels, typer's layout, which change
    # between their releases: CI installs the latest) is not the CLI's to keep.
    assert _words(normalise(result.stdout)) == _words(expected), normalise(result.stdout)


def _words(text: str) -> list[str]:
    return re.sub(r"[─━═╭╮╰╯│┃]", " ", text).split()


def test_unreachable_verifier_is_one_clear_line():
    result = edgekit("generate", "--prompt", "hi", "--verifier", "127.0.0.1:9", "--max-tokens", "4")
    assert (result.returncode, result.stdout) == (1, "")
    assert normalise(result.stderr) == (
        "edgekit: error: verifier at 127.0.0.1:9 is unavailable (<grpc detail>); is `edgekit serve` running there?\n"
    )


def test_missing_model_names_the_command_to_run(tmp_path):
    result = edgekit("generate", "--prompt", "hi", env={"EDGEKIT_CACHE_DIR": str(tmp_path)})
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"edgekit: error: model 'gemma-3-270m-q4_0' is not in the cache ({tmp_path}); "
        "run: edgekit models pull gemma-270m\n"
    )


def test_unknown_pair_lists_the_known_ones():
    result = edgekit("generate", "--prompt", "hi", "--pair", "nope")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "edgekit: error: unknown pair 'nope'; known pairs: gemma-270m, qwen-coder\n"
