"""The fleet simulator (benchmarks/rigs/fleet_sim.py, fleet_runs.py): recorded traces
replayed by simulated devices against a real gRPC verifier. Over the toy target it
runs in seconds and its faithfulness check is shown to bite; `fleet.py smoke` runs
the short real configuration on the gemma pair, as CI does."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from _paths import ROOT


@pytest.mark.timeout(600)
def test_the_smoke_configuration_runs_on_the_gemma_pair(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks", "fleet", "smoke", "--out-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    for system in ("fcfs", "wisp", "sled", "centralized"):
        assert f"{system}: " in done.stdout
    # the sessions' verdicts are the recording's, token for token (a divergence fails those systems);
    # SLED's re-prefill may part at a near tie (benchmarks/rigs/fleet_runs.py, run_fleet), and says how often
    assert re.search(r"^sled: \d+ responses, .*, \d+ diverged$", done.stdout, re.M), done.stdout
