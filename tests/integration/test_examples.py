"""The examples run, on the gemma pair."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _paths import ROOT

pytestmark = pytest.mark.models
EXAMPLES = ROOT / "examples"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_minimal(gemma_server):
    r = run(str(EXAMPLES / "minimal.py"), "--pair", "gemma-270m", "--verifier", gemma_server.address)
    assert r.returncode == 0, r.stderr
    drafted = "tokens in" in r.stdout and "acceptance" in r.stdout
    assert drafted or "tokens streamed by the verifier's target" in r.stdout  # the route "auto" took, either way


def test_iot_report_with_a_local_verifier():
    r = run(str(EXAMPLES / "iot_report.py"), "--pair", "gemma-270m", "--cycles", "2", "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("acceptance") == 2


def test_own_draft(gemma_server, gemma_paths):
    r = run(str(EXAMPLES / "own_draft.py"), str(gemma_paths[0]), "--verifier", gemma_server.address)
    assert r.returncode == 0, r.stderr
    assert "-> target gemma-3-270m" in r.stdout


def test_own_draft_with_the_wrong_tokenizer_is_one_clear_error(gemma_server):
    from edgekit.models import model_path

    r = run(str(EXAMPLES / "own_draft.py"), str(model_path("smollm2-135m-instruct")),
            "--verifier", gemma_server.address)
    assert r.returncode == 1 and "does not share a tokenizer" in r.stderr and "Traceback" not in r.stderr


def test_an_unchanged_openai_app_against_edgekit_api(gemma_server, tmp_path):
    """`edgekit api` as a user starts it, and the example app pointed at it by the environment."""
    import os
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = subprocess.Popen([sys.executable, "-m", "edgekit.cli.app", "api", "--verifier", gemma_server.address,
                            "--port", str(port), "--slots", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                assert api.poll() is None, api.stderr.read()
                assert time.monotonic() < deadline, "edgekit api did not start"
                time.sleep(0.3)
        env = {**os.environ, "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "none"}
        r = subprocess.run([sys.executable, str(EXAMPLES / "openai_app.py"), "Say hello."], capture_output=True,
                           text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("model: gemma-3-270m\n") and "draft acceptance" in r.stdout
    finally:
        api.terminate()
        api.wait(30)
