"""`edgekit probe`: a live verifier, a dead one and a silent one."""

from __future__ import annotations

import json
import re
import socket
import time
from textwrap import dedent

import pytest
from _transcript import PROBE, PROBE_LINK, edgekit, normalise, normalise_json, transcript

pytestmark = pytest.mark.models

def test_probe_measures_the_link_and_the_costs_and_names_a_choice(gemma_server):
    r = edgekit("probe", gemma_server.address, "--pair", "gemma-270m", "--json", "--calibration-tokens", "24")
    assert r.returncode == 0, r.stderr
    address = {gemma_server.address: "<address>"}
    assert normalise_json(r.stdout, PROBE, address) == transcript("probe-gemma.json") and r.stderr == ""
    out = json.loads(r.stdout)
    link, costs, choice = out["link"], out["costs"], out["choice"]
    assert 0 < link["rtt_ms"] < 50 and link["samples"] > 10  # pings and the calibration rounds
    assert costs["measured"] and costs["draft_step_ms"] > 0 and 0 < costs["acceptance"] < 1
    assert choice["upload"] in ("fh", "sh") and 1 <= choice["window"] <= 8
    # WISV's rule on the RTT it reports (loopback is below 10 ms, unless a busy CPU delays the rounds)
    assert choice["rtt_rule_upload"] == ("fh" if link["rtt_ms"] > 10.0 else "sh")
    per_token = {w["window"]: min(w["fh_ms_per_token"], w["sh_ms_per_token"]) for w in out["windows"]}
    assert choice["ms_per_token"] == pytest.approx(min(per_token.values()))
    assert out["calibration"]["rounds"] > 0 and out["calibration"]["uplink_bytes"] > 0
    human = edgekit("probe", gemma_server.address, "--pair", "gemma-270m", "--link-only")
    assert human.returncode == 0, human.stderr
    # the table marks the window the policy chose (the transcript's placeholders hide both)
    marked = [line.split()[0] for line in human.stdout.splitlines() if line.endswith("  <")]
    assert marked == re.findall(r"^policy: .. with a window of (\d+) ", human.stdout, re.MULTILINE)
    assert normalise(human.stdout, address) == dedent("""\
        verifier <address> (<n> pings, <s>)
          RTT <ms> (jitter <ms>), uplink <Mbit/s>, downlink <Mbit/s>, loss 0.0%
          costs (defaults (--link-only)): draft 10.00 ms/step, verify 10.0 + 5.00 ms/token, acceptance 0.70
          window   FH ms/token   SH ms/token
               1   <ms>   <ms>
               2   <ms>   <ms>
               3   <ms>   <ms>
               4   <ms>   <ms>
               5   <ms>   <ms>
               6   <ms>   <ms>
               7   <ms>   <ms>
               8   <ms>   <ms>
        policy: <upload> with a window of <k> (<ms> per committed token); the 10 ms RTT rule would send SH (<ms>)
        """)
    assert human.stderr == "costs are defaults; drop --link-only to measure them on this device and verifier\n"


def test_probing_a_dead_verifier_is_one_line_within_the_deadline():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    t0 = time.monotonic()
    r = edgekit("probe", f"127.0.0.1:{port}", "--timeout", "2", "--link-only")
    assert (r.returncode, r.stdout) == (1, "") and time.monotonic() - t0 < 20
    assert normalise(r.stderr, {f"127.0.0.1:{port}": "<address>"}) == (
        "edgekit: error: verifier at <address> is unavailable (<grpc detail>); is `edgekit serve` running there?\n"
    )


def test_probing_a_silent_verifier_fails_at_its_deadline(silent_address):
    t0 = time.monotonic()
    r = edgekit("probe", silent_address, "--timeout", "2", "--link-only")
    elapsed = time.monotonic() - t0
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (
        f"edgekit: error: verifier at {silent_address} did not answer a ping within 2 s; "
        "is it overloaded, or the address wrong?\n"
    )
    assert elapsed < 15  # the process start and one 2 s deadline, not a hang


@pytest.fixture
def toy_target_server(request):
    """A real gRPC verifier over a toy engine that names itself as `request.param`."""
    from edgekit.testing import ToyLanguageModel, toy_server

    lm = ToyLanguageModel(seed=3, name=request.param)
    with toy_server(lm, max_sessions=4, max_context=256) as server:
        yield server


def test_probe_without_a_pair_drafts_with_the_gemma_pair_for_a_gemma_verifier(gemma_server):
    r = edgekit("probe", gemma_server.address, "--json", "--calibration-tokens", "16")
    assert r.returncode == 0, r.stderr
    assert normalise_json(r.stdout, PROBE, {gemma_server.address: "<address>"}) == transcript("probe-gemma.json")
    assert json.loads(r.stdout)["calibration"]["rounds"] > 0
    assert r.stderr == "the verifier serves gemma-3-270m: probing with gemma-270m\n"


@pytest.mark.parametrize("toy_target_server", ["qwen2.5-coder-1.5b-instruct"], indirect=True)
def test_probe_without_a_pair_picks_the_qwen_pair_for_a_verifier_of_its_target(toy_target_server, tmp_path):
    r = edgekit("probe", toy_target_server.address, "--link-only", "--json", "--plot", str(tmp_path / "probe.png"))
    assert r.returncode == 0, r.stderr
    # the pair is qwen-coder, and the costs are the defaults for the qwen draft's width (896)
    assert normalise_json(r.stdout, PROBE_LINK, {toy_target_server.address: "<address>"}) == transcript(
        "probe-qwen-link-only.json"
    )
    assert r.stderr == (
        "the verifier serves qwen2.5-coder-1.5b-instruct: probing with qwen-coder\n"
        f"figure: {tmp_path / 'probe.png'}\n"
    )
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # --plot: the windows drawn


@pytest.mark.parametrize("toy_target_server", ["mystery-7b"], indirect=True)
def test_probe_of_a_verifier_no_pair_fits_names_the_pairs_that_would(toy_target_server):
    r = edgekit("probe", toy_target_server.address, "--link-only")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (
        "edgekit: error: the verifier serves 'mystery-7b', which is not the target of any registered pair, and no "
        "cached draft shares its tokenizer; registered pairs: gemma-270m (target gemma-3-270m: edgekit models pull "
        "gemma-270m); qwen-coder (target qwen2.5-coder-1.5b-instruct: edgekit models pull qwen-coder). Run a "
        "verifier for one of these targets, or, from Python, give a draft model of its family "
        "(EdgeClient(url, draft=PATH))\n"
    )


def test_a_stock_server_needs_the_draft_or_the_pair_named():
    r = edgekit("probe", "openai+http://127.0.0.1:9/v1", "--link-only")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (
        "edgekit: error: a stock server (openai+http://, sglang+http://, trtllm+http://) cannot say which target "
        "it serves before a draft is loaded: name the draft with --draft, or the pair with --pair\n"
    )
