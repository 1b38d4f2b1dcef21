"""edgekit installs and drafts without a C compiler: the logit kernel is optional, numpy
computes the same statistics, and `edgekit profile` names the implementation in use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from textwrap import dedent

from _paths import ROOT
from _transcript import PROFILE, normalise_json


def test_a_wheel_built_without_a_compiler_works_and_says_it_uses_numpy(tmp_path, gemma_paths):
    source = tmp_path / "src"  # a copy, so no earlier build output can slip into the wheel
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.so", "*.egg-info",
                                                                "__pycache__", "results", "traces"))
    env = {**os.environ, "CC": "/nonexistent/cc", "LDSHARED": "/nonexistent/cc -shared"}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=source, env=env, capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next(tmp_path.glob("edgekit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "edgekit/runtime/_logits.py" in names and not any("_logitstats" in n and n.endswith(".so") for n in names)

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    run_env = {**os.environ, "EDGEKIT_THREADS": "1"}
    run_env.pop("EDGEKIT_KERNEL", None)
    # the wheel's files first, and this checkout's editable install (a finder on sys.meta_path) out of the way
    prelude = (f"import sys; sys.path.insert(0, {str(site)!r}); "
               "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]; ")
    where = subprocess.run(
        [sys.executable, "-c", prelude + "import edgekit, edgekit.runtime as r; print(edgekit.__file__, r.KERNEL)"],
        env=run_env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()
    assert where[0].startswith(str(site)) and where[1] == "numpy"
    profile = subprocess.run(
        [sys.executable, "-c", prelude + "from edgekit.cli.app import main; sys.argv = ['edgekit', 'profile', "
         "'--steps', '20', '--predictor', 'none', '--json']; main()"],
        env=run_env, capture_output=True, text=True, timeout=300,
    )
    assert profile.returncode == 0, profile.stderr[-3000:]
    assert normalise_json(profile.stdout, PROFILE) == dedent("""\
        {
          "draft": "gemma-3-270m-q4_0",
          "n_vocab": 262144,
          "steps": 20,
          "threads": 1,
          "cpu": "<cpu>",
          "kernel": "numpy",
          "draft_step_us": {
            "median": "<us>",
            "p99": "<us>",
            "mean": "<us>"
          },
          "deciding_step_us": {
            "median": "<us>",
            "p99": "<us>",
            "mean": "<us>"
          },
          "added_us": {
            "median": "<us>",
            "p99": "<us>",
            "mean": "<us>"
          },
          "added_share": "<share>",
          "features_us": {
            "median": "<us>",
            "p99": "<us>",
            "mean": "<us>"
          },
          "features_share": "<share>",
          "pair": "gemma-270m"
        }
        """) and profile.stderr == ""
    assert json.loads(profile.stdout)["draft_step_us"]["median"] > 0
