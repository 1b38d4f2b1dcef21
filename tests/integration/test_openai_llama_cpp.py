"""The OpenAI-compatible transport against a real third-party server on loopback:
llama-cpp-python's own server, started here with the gemma target."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _paths import ROOT, TESTS
from _serve_process import free_port
from _wait import until

from edgekit import ClientConfig, ConfigError, EdgeClient, GenerationConfig, ProtocolError
from edgekit.protocol import OpenRequest
from edgekit.runtime import default_threads
from edgekit.transport import OpenAITransport

pytestmark = pytest.mark.models
pytest.importorskip("fastapi", reason="llama-cpp-python's server needs the test extras (fastapi, uvicorn)")

PROMPTS = ["def fibonacci(n):\n", "The three primary colours are", "Paris is the capital of"]
GUIDE = ROOT / "docs" / "guides" / "verifiers-and-engines.md"
# Answers of 8 tokens: each round's request echoes its whole context with logprobs, and llama-cpp-python's
# server sorts the whole vocabulary in Python for every echoed position (~0.3 s each on gemma's 262,144),
# so a round costs its context's length. 8 tokens at K = 3 are still several rounds, drafts accepted.
ANSWER_TOKENS = 8
# The deadline of each call to that server. Its Python sort makes an 8-token answer with logprobs take ~5 s
# on an idle 2-core machine, and over 30 s (the client's default deadline) in a CI run where the other test
# worker kept both cores busy with llama.cpp. The deadline is there to end a hung server, not to time one.
SERVER_DEADLINE_S = 300.0




def _started(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    """`cmd` started, once its port takes connections; its output in `log`."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def listening() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"llama-cpp-python's server exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    try:
        until(listening, "llama-cpp-python's server listening", timeout=120)
    except BaseException:
        proc.kill()
        raise
    return proc


def guide_recipe() -> list[str]:
    """The command the verifiers guide gives for llama-cpp-python's server, as words."""
    lines = [line.strip() for line in GUIDE.read_text().splitlines()]
    shown = [line for line in lines if line.startswith("python -m llama_cpp.server ")]
    assert len(shown) == 1, f"{GUIDE.name} should show llama-cpp-python's server command once, shows {len(shown)}"
    return shlex.split(shown[0], comments=True)


def test_the_guides_llama_cpp_python_recipe_starts_a_server_that_verifies(gemma_paths, gemma_draft, tmp_path):
    """The recipe as a user copies it, only the model path and port theirs: on a CPU with AMX, the
    server's defaults die on the first completion (the guide says why), so a recipe that answers here
    and on such a CPU is the one the guide must show."""
    words = guide_recipe()
    assert words[:3] == ["python", "-m", "llama_cpp.server"]
    port = free_port()
    cmd = [sys.executable, *words[1:]]
    for option, value in (("--model", str(gemma_paths[1])), ("--port", str(port))):
        assert option in cmd, f"the guide's recipe names no {option}"
        cmd[cmd.index(option) + 1] = value
    proc = _started(cmd, port, tmp_path / "server.log")
    try:
        with _client(f"openai+http://127.0.0.1:{port}/v1", gemma_draft, max_tokens=ANSWER_TOKENS) as client:
            final = client.generate(PROMPTS[2]).until_done()
            assert len(final.token_ids) == ANSWER_TOKENS and final.stats.rounds > 0 and final.stats.accepted > 0
            assert final.text.strip()
        assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def llama_server(gemma_paths, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    # llama-cpp-python's server, stock but for two llama.cpp settings its CLI lacks (see the launcher).
    # Batches of one row: the server then computes every position, prompt or generated, with the kernels
    # a single row takes, so its prompt logprobs (what the transport verifies with) and its own greedy
    # decoding agree bit for bit on any CPU. With batches, its prompt rows take other kernels than its
    # generated ones: measured on gemma, up to 0.8 nats apart in the top-5 logprobs (AVX-512 and
    # AVX2-only builds), where these prompts have near-ties of 0.01 nats, and either answer is the
    # server's own greedy decoding along one of its two paths.
    # Its threads are edgekit's (EDGEKIT_THREADS: a test worker's share of the cores).
    launcher = TESTS / "servers" / "llama_cpp_openai.py"
    threads = str(default_threads())
    cmd = [sys.executable, str(launcher), "--model", str(gemma_paths[1]), "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "1024", "--n_threads", threads, "--n_threads_batch", threads, "--logits_all", "true",
           "--flash_attn", "true", "--n_batch", "1", "--n_ubatch", "1"]
    proc = _started(cmd, port, log)
    yield f"openai+http://127.0.0.1:{port}/v1"
    proc.terminate()
    proc.wait(10)


def _client(url: str, draft, **gen) -> EdgeClient:  # type: ignore[no-untyped-def]
    config = GenerationConfig(**({"max_tokens": 24, "drafting": "fixed", "draft_k": 3, "stop_at_eos": False} | gen))
    return EdgeClient(url, draft=draft, generation=config, config=ClientConfig(timeout=SERVER_DEADLINE_S))


@pytest.mark.numerics
def test_greedy_through_the_openai_server_is_its_own_target_only_decoding(llama_server, gemma_draft):
    with _client(llama_server, gemma_draft) as client:
        info = client.server_info()
        assert (info.backend, info.modes, info.prefix_cache) == ("openai", ("greedy", "sample"), False)
        assert info.tokenizer_check == "probe text through /extras/tokenize"
        assert client.transport.prompt_ids is False  # llama-cpp-python's server takes text prompts only
        for prompt in PROMPTS[:2]:  # the server reads each round's context a row at a time: two answers suffice
            alone = client.generate_target_only(prompt, max_tokens=ANSWER_TOKENS).until_done()
            spec = client.generate(prompt, max_tokens=ANSWER_TOKENS).until_done()
            assert spec.token_ids == alone.token_ids, prompt
            assert spec.stats.accepted > 0 and spec.stats.rounds < len(spec.token_ids)


def test_what_text_prompts_cannot_carry_is_refused_not_verified_shifted(llama_server, gemma_draft):
    transport = OpenAITransport(llama_server.removeprefix("openai+"), gemma_draft, timeout=SERVER_DEADLINE_S)
    transport.handshake(gemma_draft.fingerprint(), draft_model=gemma_draft.name, draft_hidden_size=0)
    # "Hello" as two tokens: the server would read the text back as one
    split = gemma_draft.tokenize("Hel") + gemma_draft.tokenize("lo", add_special=False)
    assert gemma_draft.detokenize(split[1:]) == "Hello" and len(gemma_draft.tokenize("Hello")) < len(split)
    opened = transport.open_session(OpenRequest(split, mode="greedy", seed=0,
                                    draft=gemma_draft.fingerprint()))
    from edgekit.protocol import BlockRequest

    with pytest.raises(ProtocolError, match="cannot be verified through text prompts"):
        transport.verify(BlockRequest(opened.session_id, len(split), gemma_draft.tokenize(" world", add_special=False)))
    transport.close()


def test_sampling_without_a_top_k_within_the_cap_is_refused_with_the_reason(llama_server, gemma_draft):
    with _client(llama_server, gemma_draft, mode="sample") as client:
        with pytest.raises(ConfigError, match="needs a top_k from 1 to 20"):
            client.generate("x").until_done()


def test_a_wrong_api_path_names_the_fix(llama_server, gemma_draft):
    with _client(llama_server.replace("/v1", "/v2"), gemma_draft) as client:
        with pytest.raises(ProtocolError, match="HTTP 404.*check the URL's path"):
            client.server_info()
