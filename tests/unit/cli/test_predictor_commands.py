"""CLI transcripts for the predictor workflow: collect -> train -> use -> profile."""

from __future__ import annotations

import json
import sys
from textwrap import dedent

import pytest
from _transcript import normalise, normalise_json, transcript
from typer.testing import CliRunner

from edgekit import EdgeClient, GenerationConfig
from edgekit.cli import _connect as cli_client
from edgekit.cli.app import app
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_verifier

pytest.importorskip("onnx")
runner = CliRunner()


@pytest.fixture
def fake_client(monkeypatch):
    def build_client(*, pair, verifier, timeout, token, generation, announce=True, local_server=None, **_):
        target = ToyLanguageModel(seed=3, eos_bias=-6.0)
        draft = FakeDraftModel(ToyLanguageModel(seed=3, noise=1.5, eos_bias=-6.0))
        return EdgeClient(toy_verifier(target), draft=draft, generation=generation or GenerationConfig())

    monkeypatch.setattr(cli_client, "build_client", build_client)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i} " * (i + 1)}) + "\n" for i in range(12)))
    return path


def test_collect_then_train_then_generate_with_the_result(fake_client, prompts, tmp_path):
    trace = tmp_path / "t.npz"
    r = runner.invoke(app, ["predictor", "collect", "--prompts", str(prompts), "-o", str(trace), "-n", "40", "--json"])
    assert r.exit_code == 0, r.output
    assert normalise_json(r.stdout, {}, {tmp_path: "<tmp>"}) == dedent("""\
        {
          "positions": 1735,
          "accepted": 239,
          "first_rejections": 230,
          "after_rejection": 1266,
          "prompts": 12,
          "draft": "toy",
          "target": "toy",
          "path": "<tmp>/t.npz"
        }
        """)
    assert r.stderr == dedent("""\
        [1/12] p0: 102 positions
        [2/12] p1: 145 positions
        [3/12] p2: 140 positions
        [4/12] p3: 153 positions
        [5/12] p4: 165 positions
        [6/12] p5: 181 positions
        [7/12] p6: 128 positions
        [8/12] p7: 160 positions
        [9/12] p8: 162 positions
        [10/12] p9: 152 positions
        [11/12] p10: 102 positions
        [12/12] p11: 145 positions
        """)

    def train(out):
        r = runner.invoke(app, ["predictor", "train", str(trace), "-o", str(out), "--round-ms", "40"])
        assert r.exit_code == 0 and r.stdout == "", r.output
        # the goodput is replayed with the trace's measured draft step: a time
        return normalise(r.stderr, {tmp_path: "<tmp>"})

    stem = tmp_path / "out" / "toy"
    trained = train(stem)
    assert trained == (
        "wrote <tmp>/out/toy.onnx (logistic, threshold 0.563): validation AUC 0.674, specificity 0.721, recall on "
        "accepted 0.595; replayed acceptance 0.306, goodput <tok/s> (best fixed window 3: <tok/s>)\n"
    )
    card = json.loads(stem.with_suffix(".json").read_text())
    assert card["cost_model"]["round_ms"] == 40.0 and card["features"]
    assert set(card["candidates"]) == {"logistic", "mlp"}
    assert card["onnx_max_abs_diff_vs_numpy"] < 1e-4
    assert "| predictor |" in stem.with_suffix(".md").read_text()
    # training is reproducible: the same trace and options give the same model
    again = tmp_path / "again" / "toy"
    assert train(again) == trained.replace("<tmp>/out/", "<tmp>/again/")
    assert again.with_suffix(".onnx").read_bytes() == stem.with_suffix(".onnx").read_bytes()

    # the card holds the rule for every round cost, and the schedule command writes it again alike
    schedule = card["delay_schedule"]
    assert len(schedule) == 50 and {p["stop"] for p in schedule} <= {"before", "after"}
    assert "## Stopping rule by round cost" in stem.with_suffix(".md").read_text()
    r = runner.invoke(app, ["predictor", "schedule", str(stem.with_suffix(".json")), str(trace)])
    assert r.exit_code == 0 and r.stdout == "", r.output
    assert "wrote the delay schedule of" in r.stderr and "(50 round costs)" in r.stderr
    assert json.loads(stem.with_suffix(".json").read_text())["delay_schedule"] == schedule

    # one operating threshold: the rounds do not depend on measured times, so the transcript is exact
    r = runner.invoke(
        app,
        ["generate", "--prompt", "hello", "-n", "30", "--drafting", "predictor", "--predictor",
         str(stem.with_suffix(".onnx")), "--no-predictor-schedule", "--json"],
    )
    assert r.exit_code == 0, r.output
    assert normalise_json(r.stdout) == transcript("generate-predictor-toy.json") and r.stderr == ""
    # by default the predictor follows its schedule (the rounds follow the measured costs)
    r = runner.invoke(app, ["generate", "--prompt", "hello", "-n", "30", "--drafting", "predictor", "--predictor",
                            str(stem.with_suffix(".onnx")), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["drafting"] == "predictor-toy+delay"


def edgekit_main(capsys, *args: str) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of the real entry point (its error boundary) in this process."""
    from edgekit.cli.app import main

    argv = sys.argv
    sys.argv = ["edgekit", *args]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = argv
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_schedule_refuses_a_card_without_its_model(fake_client, tmp_path, capsys):
    card = tmp_path / "lonely.json"
    card.write_text("{}")
    code, out, err = edgekit_main(capsys, "predictor", "schedule", str(card), str(tmp_path / "t.npz"))
    assert code != 0 and out == ""
    assert "is not a predictor card beside its ONNX model" in err


def test_train_refuses_what_it_cannot_use(fake_client, tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"nope")
    code, out, err = edgekit_main(capsys, "predictor", "train", str(bad), "-o", str(tmp_path / "x"))
    assert (code, out) == (1, "")
    # after the colon, numpy's own words (they vary with its version)
    assert normalise(err, {tmp_path: "<tmp>"}, also=[(r"(cannot read trace: ).+", r"\1<numpy's words>")]) == (
        "edgekit: error: cannot read trace: <numpy's words>\n"
    )
    assert not list(tmp_path.glob("x.*"))  # nothing half-written


def test_predictor_that_does_not_exist_is_one_clear_error(fake_client, capsys):
    assert edgekit_main(
        capsys, "generate", "--prompt", "x", "--drafting", "predictor", "--predictor", "/nonexistent.onnx"
    ) == (1, "", "edgekit: error: no predictor at /nonexistent.onnx\n")
