"""Every command that reaches a verifier, run as the docs say to give a device its token: with
EDGEKIT_TOKEN and EDGEKIT_TIMEOUT set (issue 66, item 1: each ended in a TypeError), against the
real gemma verifier requiring that token. In fresh processes, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest
from _serve_process import free_port
from _transcript import edgekit
from _wait import until

from edgekit import ServerConfig
from edgekit.verifier import VerifierServer

pytestmark = pytest.mark.models

TOKEN = "device-token-0123456789abcdef"
ENV = {"EDGEKIT_TOKEN": TOKEN, "EDGEKIT_TIMEOUT": "120"}


@pytest.fixture(scope="module")
def guarded(gemma_paths):
    config = ServerConfig(port=0, max_sessions=6, max_context=1024, max_block=16, token=TOKEN)
    with VerifierServer(gemma_paths[1], config, name="gemma-3-270m") as server:
        yield server.address




def test_generate_takes_its_token_and_deadline_from_the_environment(guarded):
    args = ("generate", "--verifier", guarded, "-p", "def add(a, b):", "--max-tokens", "12", "--json")
    spec = edgekit(*args, "--draft-k", "4", env={**ENV, "EDGEKIT_FIRST_ROUTE": "speculative"})
    base = edgekit(*args, "--baseline", "target-only", env=ENV)
    assert spec.returncode == 0 and base.returncode == 0, spec.stderr + base.stderr
    assert json.loads(spec.stdout)["token_ids"] == json.loads(base.stdout)["token_ids"]
    # a flag still wins over the environment, and a wrong token is one clear line
    wrong = edgekit(*args, "--token", "not-the-token", env=ENV)
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    assert "token" in wrong.stderr.lower() and len(wrong.stderr.strip().splitlines()) <= 2, wrong.stderr


def test_chat_plan_and_probe_take_the_environment(guarded, tmp_path):
    chat = edgekit("chat", "--verifier", guarded, "-p", "Say hi.", "--max-tokens", "6", env=ENV)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n")
    plan = edgekit("plan", str(prompts), "--verifier", guarded, "--max-tokens", "8", "--json", env=ENV)
    assert plan.returncode == 0 and json.loads(plan.stdout)["prompts"] == 1, plan.stderr
    probe = edgekit("probe", guarded, "--link-only", "--json", env=ENV)
    assert probe.returncode == 0 and json.loads(probe.stdout)["link"]["rtt_ms"] > 0, probe.stderr


def test_a_token_in_the_environment_is_not_sent_in_plaintext_to_another_machine():
    # refused before any connection: nothing listens at this name, nothing is sent
    r = edgekit("generate", "--verifier", "verifier.example:50551", "-p", "hi", env=ENV)
    assert r.returncode != 0 and "plaintext" in r.stderr and "--insecure" in r.stderr and "Traceback" not in r.stderr




def test_api_takes_the_environment_and_answers(guarded):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.app", "api", "--verifier", guarded, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, **ENV},
    )
    try:
        def listening() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        until(listening, "edgekit api listening", timeout=240)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                       json={"model": "gemma-3-270m", "prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert "Traceback" not in err and not re.search(r"TypeError", err), err


def test_the_verifier_a_client_starts_on_loopback_takes_only_that_clients_calls():
    """`chat`, `generate` and `api` without --verifier start the target on a loopback port, where
    any local user could reach it: it takes only a token drawn for the process that started it."""
    import grpc

    from edgekit import EdgeClient, GenerationConfig
    from edgekit.protocol import SERVICE_NAME

    with EdgeClient(pair="gemma-270m", generation=GenerationConfig(max_tokens=4)) as client:
        address = client.local_verifier_address
        assert address is not None and address.startswith("127.0.0.1:")
        assert client.generate("The capital of France is").text().strip()
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                channel.unary_unary(f"/{SERVICE_NAME}/Ping")(b"", timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
