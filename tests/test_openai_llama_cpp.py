"""The OpenAI-compatible transport against a real third-party server on loopback:
llama-cpp-python's own server, started here with the gemma target."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekit import ConfigError, EdgeClient, GenerationConfig, ProtocolError
from edgekit.protocol import OpenRequest
from edgekit.transport import OpenAITransport

pytestmark = pytest.mark.models
pytest.importorskip("fastapi", reason="llama-cpp-python's server needs the test extras (fastapi, uvicorn)")

PROMPTS = ["def fibonacci(n):\n", "The three primary colours are", "Paris is the capital of"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(gemma_paths, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    # llama-cpp-python's server, stock but for two llama.cpp settings its CLI lacks (see the launcher).
    # Batches of one row: the server then computes every position, prompt or generated, with the kernels
    # a single row takes, so its prompt logprobs (what the transport verifies with) and its own greedy
    # decoding agree bit for bit on any CPU. With batches, its prompt rows take other kernels than its
    # generated ones: measured on gemma, up to 0.8 nats apart in the top-5 logprobs (AVX-512 and
    # AVX2-only builds), where these prompts have near-ties of 0.01 nats, and either answer is the
    # server's own greedy decoding along one of its two paths.
    launcher = Path(__file__).parent / "servers" / "llama_cpp_openai.py"
    cmd = [sys.executable, str(launcher), "--model", str(gemma_paths[1]), "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "1024", "--n_threads", "1", "--n_threads_batch", "1", "--logits_all", "true",
           "--flash_attn", "true", "--n_batch", "1", "--n_ubatch", "1"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llama-cpp-python's server exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.5)
    yield f"openai+http://127.0.0.1:{port}/v1"
    proc.terminate()
    proc.wait(10)


def _client(url: str, draft, **gen) -> EdgeClient:  # type: ignore[no-untyped-def]
    config = GenerationConfig(**({"max_tokens": 24, "drafting": "fixed", "draft_k": 3, "stop_at_eos": False} | gen))
    return EdgeClient(url, draft_model=draft, generation=config)


@pytest.mark.numerics
def test_greedy_through_the_openai_server_is_its_own_target_only_decoding(llama_server, gemma_draft):
    with _client(llama_server, gemma_draft) as client:
        info = client.server_info()
        assert (info.backend, info.modes, info.prefix_cache) == ("openai", ("greedy", "sample"), False)
        assert info.tokenizer_check == "probe text through /extras/tokenize"
        assert client.transport.prompt_ids is False  # llama-cpp-python's server takes text prompts only
        for prompt in PROMPTS[:2]:  # the server reads each round's context a row at a time: two answers suffice
            alone = client.generate_target_only(prompt, max_tokens=16).until_done()
            spec = client.generate(prompt, max_tokens=16).until_done()
            assert spec.token_ids == alone.token_ids, prompt
            assert spec.stats.accepted > 0 and spec.stats.rounds < len(spec.token_ids)


def test_what_text_prompts_cannot_carry_is_refused_not_verified_shifted(llama_server, gemma_draft):
    transport = OpenAITransport(llama_server.removeprefix("openai+"), gemma_draft)
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
