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
