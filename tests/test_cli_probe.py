"""`edgekit probe`: a live verifier, a dead one and a silent one."""

from __future__ import annotations

import json
import socket
import time

import pytest
from test_cli import edgekit

pytestmark = pytest.mark.models


def test_probe_measures_the_link_and_the_costs_and_names_a_choice(gemma_server):
    r = edgekit("probe", gemma_server.address, "--pair", "gemma-270m", "--json", "--calibration-tokens", "24")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    link, costs, choice = out["link"], out["costs"], out["choice"]
    assert 0 < link["rtt_ms"] < 50 and link["samples"] > 10  # pings and the calibration rounds
    assert costs["measured"] and costs["draft_step_ms"] > 0 and 0 < costs["acceptance"] < 1
    assert choice["upload"] in ("fh", "sh") and 1 <= choice["window"] <= 8
    assert choice["rtt_rule_upload"] == "sh"  # loopback: below 10 ms
    per_token = {w["window"]: min(w["fh_ms_per_token"], w["sh_ms_per_token"]) for w in out["windows"]}
    assert choice["ms_per_token"] == pytest.approx(min(per_token.values()))
    assert out["calibration"]["rounds"] > 0 and out["calibration"]["uplink_bytes"] > 0
    human = edgekit("probe", gemma_server.address, "--pair", "gemma-270m", "--link-only")
    assert human.returncode == 0 and "policy:" in human.stdout and "the 10 ms RTT rule" in human.stdout


def test_probing_a_dead_verifier_is_one_line_within_the_deadline():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    t0 = time.monotonic()
    r = edgekit("probe", f"127.0.0.1:{port}", "--timeout", "2", "--link-only")
    assert r.returncode == 1 and time.monotonic() - t0 < 20
    assert r.stderr.startswith("edgekit: error: verifier at 127.0.0.1:") and "unavailable" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_probing_a_silent_verifier_fails_at_its_deadline(silent_address):
    t0 = time.monotonic()
    r = edgekit("probe", silent_address, "--timeout", "2", "--link-only")
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stdout
    assert "did not answer a ping within 2 s" in r.stderr
    assert elapsed < 15  # the process start and one 2 s deadline, not a hang


@pytest.fixture
def toy_target_server(request):
    """A real gRPC verifier over a toy engine that names itself as `request.param`."""
    from edgekit import ServerConfig
    from edgekit.testing import ToyLanguageModel
    from edgekit.verifier import ToyEngine, VerifierServer

    lm = ToyLanguageModel(seed=3, name=request.param)
    with VerifierServer(ToyEngine(lm, n_seq=4, max_context=256), ServerConfig(port=0, max_sessions=4)) as server:
        yield server


def test_probe_without_a_pair_drafts_with_the_gemma_pair_for_a_gemma_verifier(gemma_server):
    r = edgekit("probe", gemma_server.address, "--json", "--calibration-tokens", "16")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["pair"] == "gemma-270m" and out["costs"]["measured"] and out["calibration"]["rounds"] > 0
    assert "the verifier serves gemma-3-270m: probing with gemma-270m" in r.stderr


@pytest.mark.parametrize("toy_target_server", ["qwen2.5-coder-1.5b-instruct"], indirect=True)
def test_probe_without_a_pair_picks_the_qwen_pair_for_a_verifier_of_its_target(toy_target_server, tmp_path):
    r = edgekit("probe", toy_target_server.address, "--link-only", "--json", "--plot", str(tmp_path / "probe.png"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["pair"] == "qwen-coder" and out["costs"]["hidden_size"] == 896  # the qwen draft's width
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # --plot: the windows drawn


@pytest.mark.parametrize("toy_target_server", ["mystery-7b"], indirect=True)
def test_probe_of_a_verifier_no_pair_fits_names_the_pairs_that_would(toy_target_server):
    r = edgekit("probe", toy_target_server.address, "--link-only")
    assert r.returncode == 1
    assert "the verifier serves 'mystery-7b', which is not the target of any registered pair" in r.stderr
    for pair, target in (("gemma-270m", "gemma-3-270m"), ("qwen-coder", "qwen2.5-coder-1.5b-instruct")):
        assert f"{pair} (target {target}: edgekit models pull {pair})" in r.stderr


def test_a_stock_server_needs_the_pair_named():
    r = edgekit("probe", "openai+http://127.0.0.1:9/v1", "--link-only")
    assert r.returncode == 1 and "name the pair with --pair" in r.stderr
