"""CLI transcripts for the predictor workflow: collect -> train -> use -> profile."""

from __future__ import annotations

import json

import pytest
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
        return EdgeClient(toy_verifier(target), draft_model=draft, generation=generation or GenerationConfig())

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
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["prompts"] == 12 and summary["accepted"] > 0 and summary["first_rejections"] > 0
    assert summary["positions"] == summary["accepted"] + summary["first_rejections"] + summary["after_rejection"]

    stem = tmp_path / "out" / "toy"
    r = runner.invoke(app, ["predictor", "train", str(trace), "-o", str(stem), "--round-ms", "40"])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "threshold" in r.output
    card = json.loads(stem.with_suffix(".json").read_text())
    assert card["cost_model"]["round_ms"] == 40.0 and card["features"]
    assert set(card["candidates"]) == {"logistic", "mlp"}
    assert card["onnx_max_abs_diff_vs_numpy"] < 1e-4
    assert "| predictor |" in stem.with_suffix(".md").read_text()
    # training is reproducible: the same trace and options give the same model
    again = tmp_path / "again" / "toy"
    runner.invoke(app, ["predictor", "train", str(trace), "-o", str(again), "--round-ms", "40"])
    assert again.with_suffix(".onnx").read_bytes() == stem.with_suffix(".onnx").read_bytes()

    r = runner.invoke(
        app,
        ["generate", "--prompt", "hello", "-n", "30", "--drafting", "predictor", "--predictor",
         str(stem.with_suffix(".onnx")), "--json"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["drafting"] == "predictor-toy" and len(out["token_ids"]) == 30


def test_train_refuses_what_it_cannot_use(fake_client, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"nope")
    r = runner.invoke(app, ["predictor", "train", str(bad), "-o", str(tmp_path / "x")])
    assert r.exit_code != 0 and "cannot read trace" in str(r.exception)
    assert not list(tmp_path.glob("x.*"))  # nothing half-written


def test_predictor_that_does_not_exist_is_one_clear_error(fake_client, capsys):
    import sys

    from edgekit.cli.app import main

    argv = sys.argv
    sys.argv = ["edgekit", "generate", "--prompt", "x", "--drafting", "predictor", "--predictor", "/nonexistent.onnx"]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = argv
    assert exc.value.code == 1
    assert capsys.readouterr().err.strip() == "edgekit: error: no predictor at /nonexistent.onnx"


@pytest.mark.models
def test_profile_reports_the_shares_of_a_draft_step(gemma_paths, tmp_path):
    r = runner.invoke(app, ["profile", "--pair", "gemma-270m", "--steps", "40", "--threads", "1", "--json",
                            "--plot", str(tmp_path / "steps.png")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert (tmp_path / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "samples_us" not in out
    for key in ("draft_step_us", "deciding_step_us", "features_us", "predictor_us", "features_and_predictor_us"):
        assert out[key]["median"] > 0 and out[key]["p99"] >= out[key]["median"]
    assert 0 < out["features_and_predictor_share"] < 1
    # the added time is a difference of noisy steps: only its order of magnitude is certain
    assert abs(out["added_share"]) < 0.5 and out["added_us"]["median"] == pytest.approx(
        out["added_share"] * out["draft_step_us"]["median"]
    )
    assert out["n_vocab"] == 262144 and out["kernel"] in ("baseline", "avx2", "avx512f", "neon")
    r = runner.invoke(app, ["profile", "--pair", "gemma-270m", "--steps", "20", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "added by the decision" in r.output and "% of a step" in r.output
