"""The GPU suite (benchmarks/gpu/suite.py) in its CPU dry run, as CI runs it so that it does not
rot between the rare sessions that have a GPU: the same code, the verifier on the CPU with exact
numerics, two prompts, a two-device fleet. With exact numerics every lossless system's text
must equal centralized decoding's on every prompt."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _paths import ROOT

pytestmark = pytest.mark.models


@pytest.mark.timeout(900)
def test_the_dry_run_measures_every_system_and_their_texts_agree(tmp_path, gemma_paths):
    done = subprocess.run([sys.executable, "-m", "benchmarks", "gpu.suite", "--dry-run", "--out", str(tmp_path),
                           "--llama-server", ""], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert result["dry_run"] and result["numerics"] == "exact"
    runs = result["side_by_side"]["runs"]
    assert {r["system"] for r in runs} == {"local", "centralized", "edgekit-fixed-4", "edgekit-auto"}
    assert all(r["tokens"] > 0 and r["ms_per_token"] > 0 for r in runs)
    for system, agree in result["side_by_side"]["identity"].items():
        assert agree["identical"] == agree["runs"] > 0, (system, agree)
    summary = result["side_by_side"]["summary"]
    assert {v["rtt_ms"] for v in summary.values()} == {0.0, 20.0}
    speculative = [v for v in summary.values() if v["system"].startswith("edgekit")]
    assert all(v["verify_ms_per_token"] and v["verifier_cpu_ms_per_token"] for v in speculative)
    for system, r in result["fleet"]["systems"].items():
        assert all(p["errors"] == [] and p["divergences"] == 0 and p["responses"] > 0 for p in r["points"]), system
    assert (tmp_path / "gpu_suite.png").stat().st_size > 10_000
