"""CLI transcripts: what a person types and what they see."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from textwrap import dedent

import pytest
from _transcript import GENERATION, edgekit, normalise, normalise_json, transcript
from typer.testing import CliRunner

from edgekit.cli.app import app
from edgekit.protocol import OpenRequest

runner = CliRunner()




# gemma's answer, and what follows from it (how many drafted tokens the target takes), may differ on
# another CPU (llama.cpp's numerics): placeholders in the transcripts, compared between runs instead
GEMMA_ANSWER = {"token_ids": "<tokens>", "text": "<text>"}
GEMMA_ROUNDS = {
    **GEMMA_ANSWER,
    **dict.fromkeys(("rounds", "drafted", "accepted", "wasted_draft_tokens", "draft_steps", "bonus_tokens",
                     "exchanges", "uplink_bytes", "downlink_bytes", "uploads.tokens", "acceptance_rate",
                     "accepted_length", "committed_per_round", "target_passes_per_token"), "<gemma>"),
}


@pytest.mark.models
def test_generate_json_through_a_verifier_matches_the_target_only_baseline(gemma_server):
    args = ["generate", "--verifier", gemma_server.address, "--prompt", "def add(a, b):",
            "--max-tokens", "24", "--json"]
    # drafted, whichever way this machine's draft and target steps would send an "auto" first answer
    spec = runner.invoke(app, [*args, "--draft-k", "4"], env={"EDGEKIT_FIRST_ROUTE": "speculative"})
    base = runner.invoke(app, [*args, "--baseline", "target-only"])
    assert spec.exit_code == 0 and base.exit_code == 0, spec.output + base.output
    address = {gemma_server.address: "<address>"}
    assert normalise_json(spec.stdout, {**GENERATION, **GEMMA_ROUNDS}, address) == transcript("generate-gemma.json")
    assert normalise_json(base.stdout, {**GENERATION, **GEMMA_ANSWER}, address) == transcript(
        "generate-gemma-target-only.json"
    )
    assert spec.stderr == base.stderr == ""
    s, b = json.loads(spec.stdout), json.loads(base.stdout)
    assert s["token_ids"] == b["token_ids"] and len(s["token_ids"]) == 24
    assert s["text"] == b["text"]
    m = s["metrics"]
    assert m["rounds"] < 24 and m["drafted"] == m["accepted"] + m["wasted_draft_tokens"]


@pytest.mark.models
def test_generate_without_a_verifier_starts_one_on_loopback():
    result = edgekit("generate", "--prompt", "The capital of France is", "--max-tokens", "8", "--seed", "1",
                     "--mode", "sample")
    assert result.returncode == 0, result.stderr
    # gemma's sampled answer and its figures may differ on another CPU (llama.cpp's numerics)
    assert normalise(result.stdout, also=[(r"\A(?s:.*\S.*)\n\Z", "<gemma's text>\n")]) == "<gemma's text>\n"
    assert normalise(result.stderr, also=[(r"\d+ rounds, acceptance \d\.\d\d, AAL \d\.\d\d",
                                           "<n> rounds, acceptance <gemma>, AAL <gemma>")]) == dedent("""\
        started a local verifier for gemma-270m on 127.0.0.1:<port> (gemma-3-270m, exact numerics)
        [8 tokens, <tok/s>, <n> rounds, acceptance <gemma>, AAL <gemma>, finish: length]
        """)


@pytest.mark.models
def test_models_path_prints_the_cached_file():
    from edgekit.models import cache_dir

    result = runner.invoke(app, ["models", "path", "gemma-3-270m"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert result.stdout == f"{cache_dir() / 'gemma-3-270m-q4_k_m.gguf'}\n"


@pytest.mark.models
def test_serve_announces_its_address_serves_and_stops_on_sigterm(gemma_draft):
    import signal as sig

    from edgekit.transport import GrpcTransport

    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.app", "serve", "--pair", "gemma-270m", "--port", "0", "--max-sessions", "2",
         "--max-context", "512", "--metrics-port", "0", "--log-level", "info"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        lines = []  # the log's lines, then the announcement's
        while not (lines and lines[-1].startswith("metrics: ")) and len(lines) < 20:
            lines.append(proc.stderr.readline())
            assert lines[-1], "".join(lines)  # not the end of the output
        address = re.search(r" on (127\.0\.0\.1:\d+) \(", lines[-3]).group(1)
        metrics = re.search(r"^metrics: (http://127\.0\.0\.1:\d+/metrics)$", lines[-1]).group(1)
        with GrpcTransport(address) as t:
            assert t.health() == "SERVING"
            assert t.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640).max_sessions == 2
            t.open_session(
                OpenRequest([2, 3, 4], mode="greedy", seed=0, draft=gemma_draft.fingerprint())
            )
        with urllib.request.urlopen(metrics, timeout=10) as response:
            assert "edgekit:sessions 1.0" in response.read().decode().splitlines()
        proc.send_signal(sig.SIGTERM)
        assert proc.wait(timeout=60) == 0
        # whether this machine's calibration cache holds a verification-time estimator (a wisp server or
        # --calibrate measured one here) decides how the estimator starts
        estimator = [(r"time estimator (calibrated|learning from live batches)$", "time estimator <cached or not>")]
        assert normalise("".join(lines) + proc.stderr.read(), {address: "<address>", metrics: "<metrics>"},
                         estimator) == (
            "<time> INFO edgekit.verifier: metrics on <metrics>\n"
            "<time> INFO edgekit.verifier: verifier for gemma-3-270m listening on <address>\n"
            "edgekit verifier: gemma-3-270m on <address> (exact numerics, invariant batch <n>, <batching>; "
            "up to 2 sessions)\n"
            "scheduling: fcfs; SLO classes (tok/s): realtime 8, interactive 6, standard 4, relaxed 2; "
            "time estimator <cached or not>\n"
            "metrics: <metrics>\n"
            "draining: no new sessions; serving the open ones until they close or go quiet for 2 s, 10 s at most\n"
            "stopped after <s>\n"
        )
        assert proc.stdout.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()


def test_plan_prints_batches_a_window_and_a_predicted_total_for_a_prompt_file(gemma_server, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('def add(a, b):\nThe capital of France is\n\n{"prompt": "Once upon a time"}\n')
    result = runner.invoke(app, ["plan", str(prompts), "--verifier", gemma_server.address, "--max-tokens", "16",
                                 "--acceptance", "0.7", "--json"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    # the fits, the link and the plan made from them are this machine's
    varying = {"rtt_ms": "<ms>", "window": "<k>", "batches": "<batches>",
               **dict.fromkeys(("predicted_s", "one_after_another_s", "one_batch_s"), "<s>"),
               **dict.fromkeys(("c1", "c2", "mape"), "<fit>")}
    assert normalise_json(result.stdout, varying) == dedent("""\
        {
          "prompts": 3,
          "input_tokens": [
            8,
            6,
            5
          ],
          "max_tokens": 16,
          "acceptance": 0.7,
          "rtt_ms": "<ms>",
          "window": "<k>",
          "batches": "<batches>",
          "predicted_s": "<s>",
          "one_after_another_s": "<s>",
          "one_batch_s": "<s>",
          "draft_runtime": {
            "c1": "<fit>",
            "c2": "<fit>",
            "mape": "<fit>"
          },
          "verify_runtime": {
            "c1": "<fit>",
            "c2": "<fit>",
            "mape": "<fit>"
          }
        }
        """)
    out = json.loads(result.stdout)
    assert sorted(k for b in out["batches"] for k in b) == [0, 1, 2]
    assert 1 <= out["window"] <= 8 and 0 < out["predicted_s"] <= out["one_after_another_s"] * 1.0001
    # eq. 17's fit keeps both coefficients >= 0 and explains times > 0, but which of them carries the time is
    # this machine's: on a loaded 2-core runner a decode of 8 sequences can time no slower than one (c1 = 0)
    for fit in (out["draft_runtime"], out["verify_runtime"]):
        assert fit["c1"] >= 0 and fit["c2"] >= 0 and fit["c1"] + fit["c2"] > 0, fit
    bad = tmp_path / "bad.txt"
    bad.write_text('{"text": "no prompt field"}\n')
    result = runner.invoke(app, ["plan", str(bad), "--verifier", gemma_server.address], env={"COLUMNS": "2000"})
    assert (result.exit_code, result.stdout) == (2, "")
    assert normalise(result.stderr, {tmp_path: "<tmp>"}) == dedent("""\
        Usage: edgekit plan [OPTIONS] {prompts_file}
        Try 'edgekit plan --help' for help.
        ╭─ Error ─╮
        │ Invalid value: <tmp>/bad.txt: a JSON line without a "prompt": {"text": "no prompt field"} │
        ╰─╯
        """)
