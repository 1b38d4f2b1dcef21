"""CLI transcripts for the predictor workflow: collect -> train -> use -> profile."""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent

import pytest
from _transcript import PROFILE, normalise, normalise_json, transcript
from typer.testing import CliRunner

from edgekit.cli.app import app

runner = CliRunner()


@pytest.mark.models
def test_profile_reports_the_shares_of_a_draft_step(gemma_paths, tmp_path):
    from edgekit.runtime import KERNEL

    r = runner.invoke(app, ["profile", "--pair", "gemma-270m", "--steps", "40", "--threads", "1", "--json",
                            "--plot", str(tmp_path / "steps.png")])
    assert r.exit_code == 0, r.output
    assert r.stderr == f"figure: {tmp_path / 'steps.png'}\n"
    assert (tmp_path / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = json.loads(r.stdout)
    # the kernel this CPU runs, and where the repository is
    shipped = Path(out["predictor"]).parent
    assert normalise_json(r.stdout, {**PROFILE, "kernel": "<kernel>"}, {shipped: "<shipped>"}) == transcript(
        "profile-gemma.json"
    )
    for key in ("draft_step_us", "deciding_step_us", "features_us", "predictor_us", "features_and_predictor_us"):
        assert out[key]["median"] > 0 and out[key]["p99"] >= out[key]["median"]
    assert 0 < out["features_and_predictor_share"] < 1
    # the added time is a difference of noisy steps: only its order of magnitude is certain
    assert abs(out["added_share"]) < 0.5 and out["added_us"]["median"] == pytest.approx(
        out["added_share"] * out["draft_step_us"]["median"]
    )
    assert out["kernel"] in ("baseline", "avx2", "avx512f", "neon") and out["kernel"] == KERNEL
    r = runner.invoke(app, ["profile", "--pair", "gemma-270m", "--steps", "20", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert normalise(r.stdout) == dedent(f"""\
        gemma-270m: gemma-3-270m-q4_0 (vocab 262144), 20 steps, threads 1, logit kernel {KERNEL}
          draft step             median <us>   p99 <us>
          added by the decision  median <us>   p99 <us> <%> of a step
            features, timed      median <us>   p99 <us> <%> of a step
            predictor, timed     median <us>   p99 <us> <%> of a step
          (added: the median difference between neighbouring steps with and without the decision;
           the timed parts also carry the cache refill after each decode that a plain step pays elsewhere)
        """) and r.stderr == ""
