"""CLI transcripts: what a person types and what they see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest
from typer.testing import CliRunner

from edgekit.cli.app import app
from edgekit.protocol import OpenRequest

runner = CliRunner()


def edgekit(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real entry point, in a fresh process, with no standard input."""
    return subprocess.run(
        [sys.executable, "-m", "edgekit.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "command",
    [[], ["generate"], ["serve"], ["models"], ["models", "pull"], ["predictor"], ["predictor", "collect"],
     ["predictor", "train"], ["profile"], ["chat"], ["probe"], ["plan"]],
)
def test_every_command_explains_its_options(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    if command == ["generate"]:
        for option in ("--pair", "--verifier", "--prompt", "--max-tokens", "--mode", "--draft-k", "--seed", "--json",
                       "--baseline", "--drafting", "--predictor", "--max-window", "--p-min"):
            assert option in result.output
    if command == ["serve"]:
        for option in ("--policy", "--slo-class", "--metrics-port", "--log-level"):
            assert option in result.output


def test_unreachable_verifier_is_one_clear_line():
    result = edgekit("generate", "--prompt", "hi", "--verifier", "127.0.0.1:9", "--max-tokens", "4")
    assert result.returncode == 1
    assert result.stderr.startswith("edgekit: error: verifier at 127.0.0.1:9 is unavailable")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_missing_model_names_the_command_to_run(tmp_path):
    result = edgekit("generate", "--prompt", "hi", env={"EDGEKIT_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "run: edgekit models pull gemma-270m" in lines[0]


def test_unknown_pair_lists_the_known_ones():
    result = edgekit("generate", "--prompt", "hi", "--pair", "nope")
    assert result.returncode == 1 and "gemma-270m" in result.stderr and "qwen-coder" in result.stderr


@pytest.mark.models
def test_generate_json_through_a_verifier_matches_the_target_only_baseline(gemma_server):
    args = ["generate", "--verifier", gemma_server.address, "--prompt", "def add(a, b):",
            "--max-tokens", "24", "--json"]
    spec = runner.invoke(app, [*args, "--draft-k", "4"])
    base = runner.invoke(app, [*args, "--baseline", "target-only"])
    assert spec.exit_code == 0 and base.exit_code == 0, spec.output + base.output
    s, b = json.loads(spec.stdout), json.loads(base.stdout)
    assert s["method"] == "speculative" and b["method"] == "target-only"
    assert s["token_ids"] == b["token_ids"] and len(s["token_ids"]) == 24
    assert s["text"] == b["text"]
    m = s["metrics"]
    for key in ("acceptance_rate", "accepted_length", "rounds", "target_passes_per_token", "wasted_draft_tokens",
                "tokens_per_second"):
        assert key in m
    assert m["rounds"] < 24 and m["drafted"] == m["accepted"] + m["wasted_draft_tokens"]


@pytest.mark.models
def test_generate_without_a_verifier_starts_one_on_loopback():
    result = edgekit("generate", "--prompt", "The capital of France is", "--max-tokens", "8", "--seed", "1",
                     "--mode", "sample")
    assert result.returncode == 0, result.stderr
    assert "started a local verifier for gemma-270m on 127.0.0.1:" in result.stderr
    assert result.stdout.strip()
    assert "acceptance" in result.stderr.splitlines()[-1]


@pytest.mark.models
def test_models_path_prints_the_cached_file():
    result = runner.invoke(app, ["models", "path", "gemma-3-270m"])
    assert result.exit_code == 0 and result.stdout.strip().endswith(".gguf")


@pytest.mark.models
def test_serve_announces_its_address_serves_and_stops_on_sigterm(gemma_draft):
    import re
    import signal as sig

    from edgekit.transport import GrpcTransport

    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.app", "serve", "--pair", "gemma-270m", "--port", "0", "--max-sessions", "2",
         "--max-context", "512", "--metrics-port", "0", "--log-level", "info"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        lines = []  # the log's lines, then the announcement's
        while not (lines and lines[-1].startswith("metrics: ")) and len(lines) < 20:
            lines.append(proc.stderr.readline())
            assert lines[-1], "".join(lines)  # not the end of the output
        text = "".join(lines)
        match = re.search(r"on (127\.0\.0\.1:\d+) \(exact numerics, invariant batch \d+", text)
        assert match, text
        assert f"INFO edgekit.verifier: verifier for gemma-3-270m listening on {match.group(1)}" in text
        metrics = re.search(r"^metrics: (http://127\.0\.0\.1:\d+/metrics)$", lines[-1]).group(1)
        with GrpcTransport(match.group(1)) as t:
            assert t.health() == "SERVING"
            assert t.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640).max_sessions == 2
            t.open_session(
                OpenRequest([2, 3, 4], mode="greedy", temperature=1.0, seed=0, draft=gemma_draft.fingerprint())
            )
        with urllib.request.urlopen(metrics, timeout=10) as response:
            assert "edgekit:sessions 1.0" in response.read().decode().splitlines()
        proc.send_signal(sig.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "draining: no new sessions" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_plan_prints_batches_a_window_and_a_predicted_total_for_a_prompt_file(gemma_server, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('def add(a, b):\nThe capital of France is\n\n{"prompt": "Once upon a time"}\n')
    result = runner.invoke(app, ["plan", str(prompts), "--verifier", gemma_server.address, "--max-tokens", "16",
                                 "--acceptance", "0.7", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["prompts"] == 3 and sorted(k for b in out["batches"] for k in b) == [0, 1, 2]
    assert 1 <= out["window"] <= 8 and 0 < out["predicted_s"] <= out["one_after_another_s"] * 1.0001
    assert out["draft_runtime"]["c1"] > 0
    bad = tmp_path / "bad.txt"
    bad.write_text('{"text": "no prompt field"}\n')
    result = runner.invoke(app, ["plan", str(bad), "--verifier", gemma_server.address])
    assert result.exit_code != 0 and "prompt" in result.output
