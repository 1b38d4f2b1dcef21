"""Stock-server transports on fakes: SGLang's native API served locally over a toy
target, URL schemes, capability refusals and error mapping."""

from __future__ import annotations

import socket

import pytest
from http_fakes import FakeOpenAIServer, FakeSGLangServer

from edgekit import (
    ClientConfig,
    ConfigError,
    EdgeClient,
    GenerationConfig,
    IncompatibleModelsError,
    LimitExceededError,
    ProtocolError,
    VerifierError,
    VerifierUnavailableError,
)
from edgekit.protocol import BlockRequest, GenerateRequest, OpenRequest, ServerInfo
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_verifier
from edgekit.transport import GrpcTransport, OpenAITransport, SGLangTransport, connect

TARGET = ToyLanguageModel(seed=11)


def _draft(noise: float = 1.5) -> FakeDraftModel:
    return FakeDraftModel(ToyLanguageModel(seed=11, noise=noise))


def _text_of(draft: FakeDraftModel):  # type: ignore[no-untyped-def]
    return lambda t: draft.token_bytes(t).decode()


@pytest.fixture()
def sglang():
    with FakeSGLangServer(TARGET, _text_of(_draft())) as server:
        yield server


TIMEOUT = 30.0  # a deadline for calls that answer in milliseconds: generous, so a loaded machine never meets it


def _client(url: str, draft=None, *, client: ClientConfig | None = None, **gen) -> EdgeClient:  # type: ignore[no-untyped-def]
    config = GenerationConfig(**({"max_tokens": 48, "stop_at_eos": False, "drafting": "fixed", "draft_k": 5} | gen))
    client = client or ClientConfig(timeout=TIMEOUT)
    return EdgeClient(url, draft=draft or _draft(), generation=config, config=client)


def _speculates_to_the_targets_own_decoding(url: str) -> ServerInfo:
    with _client(url) as client:
        result = client.generate("speculate").until_done()
        info = client.server_info()
    request = GenerateRequest(_draft().tokenize("speculate"), "greedy", seed=0, max_tokens=48)
    reference = list(toy_verifier(TARGET).generate(request))
    assert list(result.token_ids) == [g.token for g in reference]
    assert result.stats.rounds < 48 and result.stats.accepted > 0  # drafts were accepted, several per round
    return info


def test_greedy_through_sglang_is_the_targets_own_decoding(sglang):
    info = _speculates_to_the_targets_own_decoding(f"sglang+{sglang.url}")
    assert (info.backend, info.modes, info.upload_protocols, info.prefix_cache) == (
        "sglang", ("greedy", "sample"), ("tokens",), True
    )
    assert info.tokenizer_check == "token texts of a probe text's ids"
    # every round sent ids and asked for the block's positions only
    # one request a round: ids, the top-1, from the position before each block
    before = len(sglang.requests)
    with _client(f"sglang+{sglang.url}") as client:
        client.server_info()
        handshake = len(sglang.requests)
        result = client.generate("speculate").until_done()
    rounds = sglang.requests[handshake:]
    assert handshake > before and len(rounds) == result.stats.rounds
    for r in rounds:
        assert r["top_logprobs_num"] == 1 and r["sampling_params"]["max_new_tokens"] == 1
        # from the position before the block (of 1 to draft_k = 5 tokens) on: the prefix is the radix cache's
        assert 1 <= len(r["input_ids"]) - 1 - r["logprob_start_len"] <= 5


def test_a_mode_or_upload_the_backend_lacks_is_refused_not_downgraded(sglang):
    with _client(f"sglang+{sglang.url}", mode="sample") as client:  # no top-k: the tail is not returned
        with pytest.raises(ConfigError, match="needs a top_k from 1 to 1024"):
            client.generate("x").until_done()
    with _client(f"sglang+{sglang.url}", upload="fh") as client:
        with pytest.raises(ConfigError, match="needs FH uploads, which the verifier at .* does not take"):
            client.generate("x").until_done()


def test_stock_backends_offer_no_semantic_mode(sglang):
    """Semantic verification needs hidden states a stock server does not give: refused, never downgraded."""
    with _client(f"sglang+{sglang.url}", mode="semantic", upload="fh") as client:
        with pytest.raises(ConfigError, match="does not support 'semantic' acceptance"):
            client.generate("x").until_done()
    transport = connect(f"sglang+{sglang.url}", ClientConfig(timeout=TIMEOUT), _draft())
    with pytest.raises(ConfigError, match="offers no semantic mode"):
        transport.open_session(
            OpenRequest([1, 2], mode="semantic", seed=0, draft=_draft().fingerprint())
        )


def test_a_different_tokenizer_is_refused_naming_the_server():
    from edgekit.transport import TOKENIZER_PROBE

    renamed = _draft().tokenize(TOKENIZER_PROBE)[3]  # a token of the probe text means something else there
    other = FakeSGLangServer(TARGET, lambda t: "?" if t == renamed else _text_of(_draft())(t))
    with other, _client(f"sglang+{other.url}") as client:
        with pytest.raises(IncompatibleModelsError, match="does not share a tokenizer with 'toy-target'"):
            client.server_info()


@pytest.mark.parametrize(
    "fault, error, message",
    [
        ("http500", VerifierError,
         "SGLang server at http://127.0.0.1:\\d+ answered verifying a block with HTTP 500: CUDA out of memory"),
        ("not-json", ProtocolError, "with something that is not a JSON object: '<html>502 Bad Gateway</html>'"),
        ("no-logprobs", ProtocolError, "sent no input_top_logprobs for the block"),
        ("slow", VerifierUnavailableError, "did not answer verifying a block within 2 s"),
    ],
)
def test_server_failures_map_into_the_error_tree(sglang, fault, error, message):
    # "slow" holds the answer past the 2 s deadline (until the server closes); the first failure is the answer
    with _client(f"sglang+{sglang.url}", client=ClientConfig(timeout=2.0, retry_for=0)) as client:
        client.server_info()
        sglang.fault, sglang.delay = fault, 60.0
        with pytest.raises(error, match=message):
            client.generate("x").until_done()


def test_a_dead_server_is_unavailable_with_its_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"sglang+http://127.0.0.1:{port}", f"openai+http://127.0.0.1:{port}/v1"):
        with _client(url) as client:
            with pytest.raises(VerifierUnavailableError, match=f"127.0.0.1:{port}.* is unavailable"):
                client.server_info()


def test_schemes_pick_the_transport():
    draft = _draft()
    config = ClientConfig()
    assert isinstance(connect("127.0.0.1:1", config, draft), GrpcTransport)
    assert isinstance(connect("grpc://127.0.0.1:1", config, draft), GrpcTransport)
    assert connect("grpcs://example.org:443", config, draft).config.tls
    openai = connect("openai+http://127.0.0.1:8000", config, draft)
    assert isinstance(openai, OpenAITransport) and openai.address == "http://127.0.0.1:8000/v1"
    assert isinstance(connect("sglang+https://gpu.example.org", config, draft), SGLangTransport)
    with pytest.raises(ConfigError, match="unknown verifier scheme 'vllm'.*openai\\+http://"):
        connect("vllm://127.0.0.1:8000", config, draft)


def test_rates_cannot_be_probed_without_an_echo_endpoint(sglang):
    with _client(f"sglang+{sglang.url}") as client:
        result = client.probe_link(pings=3)
    assert result.link.rtt_ms > 0 and result.link.uplink_mbps == 0 and result.pings == 3


def test_unmeasurable_rates_are_probed_once_per_client_not_at_every_session(sglang):
    with _client(f"sglang+{sglang.url}", drafting="latency", max_tokens=6) as client:
        pings = []
        ping = client.transport.ping
        client.transport.ping = lambda *a, **k: pings.append(1) or ping(*a, **k)  # type: ignore[method-assign]
        for _ in range(3):
            assert len(client.generate("speculate").until_done().token_ids) == 6
    assert len(pings) == 5 and client.link.probed and client.link.uplink_mbps == 0  # one session's probe


@pytest.fixture()
def vllm():
    draft = _draft()
    with FakeOpenAIServer(TARGET, _text_of(draft), tokenize=lambda text: draft.tokenize(text)) as server:
        yield server


def test_greedy_through_a_vllm_style_server_reads_tokens_by_id(vllm):
    """The toy vocabulary renders 64 tokens as 26 letters: only names by id say which
    token the target chose, and with them the output is the target's own decoding."""
    info = _speculates_to_the_targets_own_decoding(f"openai+{vllm.url}")
    assert (info.backend, info.tokenizer_check) == ("openai", "probe text through /tokenize")
    last = vllm.requests[-1]  # token-id prompts, tokens named by id
    assert all(isinstance(t, int) for t in last["prompt"]) and last["return_tokens_as_token_ids"] is True


def test_the_prefix_route_reads_each_prefix_once_and_decodes_as_the_target(vllm):
    """route=prefixes: a round is one-token completions of the context and each longer prefix,
    sent at once (no prompt log-probabilities, so a real vLLM reads its prefix cache for each);
    the output is the target's own greedy decoding, as through the prompt-logprobs route."""
    _speculates_to_the_targets_own_decoding(f"openai+{vllm.url}?route=prefixes")
    rounds = [r for r in vllm.requests if r.get("echo") is False and r.get("max_tokens") == 1]
    assert rounds and all(r["logprobs"] == 1 and r["temperature"] == 0 for r in rounds)
    assert not any(r.get("echo") for r in vllm.requests[-len(rounds):])  # no request re-reads the context
    prompt = len(_draft().tokenize("speculate"))
    assert sorted(len(r["prompt"]) for r in rounds[:6]) == list(range(prompt, prompt + 6))  # round 1: K + 1 prefixes


def test_a_server_without_prompt_log_probabilities_is_refused_naming_those_that_can():
    """llama.cpp's own llama-server ignores `echo`: its completions carry the generated token's
    log-probabilities only. The handshake refuses it and says which servers can verify."""

    class IgnoresEcho(FakeOpenAIServer):
        def answer(self, req: dict) -> dict:
            return super().answer({**req, "echo": False})

    draft = _draft()
    with IgnoresEcho(TARGET, _text_of(draft), tokenize=lambda text: draft.tokenize(text)) as server, \
            _client(f"openai+{server.url}") as client:
        with pytest.raises(ConfigError, match="returns no log-probabilities of prompt tokens.*vLLM.*"
                                              "llama.cpp's own llama-server ignores echo and cannot"):
            client.server_info()


def test_the_route_follows_the_context_and_the_url(vllm):
    from edgekit.transport import PREFIXES_FROM

    with _client(f"openai+{vllm.url}", max_tokens=4) as client:
        client.generate("speculate").until_done()  # a short context: prompt log-probabilities
        assert vllm.requests[-1]["echo"] is True
        client.generate([3 + i % 50 for i in range(PREFIXES_FROM)]).until_done()  # a long one: the prefixes
        assert vllm.requests[-1]["echo"] is False and vllm.requests[-1]["max_tokens"] == 1
    with _client(f"openai+{vllm.url}?route=prompt-logprobs", max_tokens=4) as client:
        client.generate([3 + i % 50 for i in range(PREFIXES_FROM)]).until_done()
        assert vllm.requests[-1]["echo"] is True
    with pytest.raises(ConfigError, match=r"route=auto\|generate\|prefixes\|prompt-logprobs"):
        connect(f"openai+{vllm.url}?route=fast", ClientConfig(), _draft())
    with pytest.raises(ConfigError, match="max_logprobs=N"):
        connect(f"openai+{vllm.url}?max_logprobs=8&colour=blue", ClientConfig(), _draft())


def test_a_server_tokenizer_that_adds_no_bos_is_a_convention_not_another_vocabulary():
    """vLLM serving a GGUF converted with transformers: its tokenizer leaves out the BOS the GGUF
    asks for. Token-id prompts carry the draft's BOS, so the target reads what it would have."""
    draft = _draft()
    no_bos = FakeOpenAIServer(TARGET, _text_of(draft), tokenize=lambda text: draft.tokenize(text, add_special=False))
    with no_bos as srv:
        info = _speculates_to_the_targets_own_decoding(f"openai+{srv.url}")
        assert info.tokenizer_check == ("probe text through /tokenize (same vocabulary; the server's tokenizer adds "
                                        "no BOS '<bos>' (id 0) where the draft's does: token-id prompts carry ours)")
        assert all(r["prompt"][0] == 0 for r in srv.requests if isinstance(r.get("prompt"), list))


def test_a_vocabulary_difference_past_the_bos_is_refused_naming_the_token():
    from edgekit.transport import TOKENIZER_PROBE

    draft = _draft()
    ours = draft.tokenize(TOKENIZER_PROBE, add_special=False)

    def other(text: str) -> list[int]:  # no BOS, and the probe's fourth token another id
        ids = draft.tokenize(text, add_special=False)
        return ids[:3] + [ids[3] + 1] + ids[4:]

    with FakeOpenAIServer(TARGET, _text_of(draft), tokenize=other) as srv, _client(f"openai+{srv.url}") as client:
        with pytest.raises(IncompatibleModelsError,
                           match=f"the vocabularies differ: .* from its token 3 on \\(not counting BOS/EOS\\): "
                           f"the draft's is '.' \\(id {ours[3]}\\), the server's id {ours[3] + 1}; use a draft"):
            client.server_info()


def _handshake(url: str) -> OpenAITransport:
    draft = _draft()
    transport = OpenAITransport(url, draft, timeout=TIMEOUT)
    transport.handshake(draft.fingerprint(), draft_model="toy", draft_hidden_size=0)
    return transport


def test_a_server_that_names_tokens_by_text_only_is_asked_once():
    with FakeOpenAIServer(TARGET, _text_of(_draft()), id_names=False) as server:
        transport = _handshake(server.url)
        assert transport.prompt_ids and not transport.id_names
        asked = len(server.requests)
        list(transport.generate(GenerateRequest(_draft().tokenize("speculate"), "greedy", seed=0, max_tokens=2)))
        assert sum(bool(r.get("return_tokens_as_token_ids")) for r in server.requests[:asked]) == 1  # the handshake's
        assert all("return_tokens_as_token_ids" not in r for r in server.requests[asked:])


@pytest.mark.parametrize(
    "fault, message",
    [("bad-id", "named the target's token 'token_id:69', not a token id of the 64-token vocabulary"),
     ("bad-echo", "echoed prompt token .* as 'token_id:.*', ours is")],
)
def test_a_wrong_token_id_is_a_protocol_error(vllm, fault, message):
    transport = _handshake(vllm.url)
    prompt = _draft().tokenize("speculate")
    opened = transport.open_session(OpenRequest(prompt, mode="greedy", seed=0,
                                    draft=_draft().fingerprint()))
    vllm.fault = fault
    with pytest.raises(ProtocolError, match=message):
        transport.verify(BlockRequest(session_id=opened.session_id, base_position=len(prompt), draft_tokens=(5, 6)))


def test_a_stock_server_takes_no_token_speed_slo(vllm):
    from edgekit.protocol import SpeedObjective

    transport = _handshake(vllm.url)
    with pytest.raises(ConfigError, match="does not schedule by token-speed SLOs"):
        transport.open_session(OpenRequest(_draft().tokenize("hi"), mode="greedy", seed=0,
                               slo=SpeedObjective(tokens_per_s=4.0), draft=_draft().fingerprint()))


def test_sglang_past_its_context_length_is_a_limit_and_a_dropped_connection_is_retried():
    draft = _draft()
    with FakeSGLangServer(TARGET, _text_of(draft), context_length=40) as sglang:
        with _client(f"sglang+{sglang.url}", max_tokens=60, client=ClientConfig(timeout=TIMEOUT, retry_for=0)) as c:
            with pytest.raises(LimitExceededError, match="longer than the model's context length \\(40 tokens\\)"):
                c.generate("speculate").until_done()
    with FakeSGLangServer(TARGET, _text_of(draft)) as sglang:
        with _client(f"sglang+{sglang.url}", client=ClientConfig(timeout=TIMEOUT, retry_initial=0.01)) as client:
            client.server_info()
            sglang.fault = "drop"  # the next request's connection closes unanswered, once
            result = client.generate("speculate").until_done()
        assert sglang.fault is None  # it was dropped
    request = GenerateRequest(draft.tokenize("speculate"), "greedy", seed=0, max_tokens=48)
    assert list(result.token_ids) == [g.token for g in toy_verifier(TARGET).generate(request)]


@pytest.fixture()
def scale_out():
    draft = _draft()
    with FakeOpenAIServer(TARGET, _text_of(draft), tokenize=lambda text: draft.tokenize(text),
                          scale_out=True) as server:
        yield server


def _generate_rounds(server: FakeOpenAIServer) -> list[dict]:
    return [r for r in server.requests if "token_ids" in r and r["sampling_params"].get("prompt_logprobs")]


def test_auto_takes_vllms_token_route_one_request_a_round_reading_the_cache(scale_out):
    """Issue 67: where vLLM answers /inference/v1/generate (--enable-scale-out), auto takes it: a
    round is one request of the whole sequence that asks vLLM to read its prefix cache, with the
    top-1 at the block's positions and the greedy token after it; the output is the target's own
    greedy decoding. Without the route (vLLM answers 403), auto goes on as before."""
    with _client(f"openai+{scale_out.url}") as client:
        client.server_info()
        asked = len(_generate_rounds(scale_out))  # the handshake's probe of the route
        result = client.generate("speculate").until_done()
        assert client.transport.generates and client.transport.engine == "vLLM 0.32.0"
    rounds = _generate_rounds(scale_out)[asked:]
    assert len(rounds) == result.stats.rounds
    assert not any("prompt" in r for r in scale_out.requests[-len(rounds):])  # no completions beside them
    for r in rounds:
        params = r["sampling_params"]
        assert params["skip_reading_prefix_cache"] is False and params["max_tokens"] == 1
        assert params["prompt_logprobs"] == params["logprobs"] == 1 and params["temperature"] == 0
    request = GenerateRequest(_draft().tokenize("speculate"), "greedy", seed=0, max_tokens=48)
    assert list(result.token_ids) == [g.token for g in toy_verifier(TARGET).generate(request)]
    draft = _draft()
    with FakeOpenAIServer(TARGET, _text_of(draft), tokenize=lambda text: draft.tokenize(text)) as plain:
        with _client(f"openai+{plain.url}") as client:
            assert list(client.generate("speculate").until_done().token_ids) == list(result.token_ids)
            assert client.transport.generates is False
        with _client(f"openai+{plain.url}?route=generate") as client:
            with pytest.raises(ConfigError, match="start vLLM with --enable-scale-out"):
                client.server_info()


def test_a_round_whose_block_the_cache_served_is_read_by_the_prefixes(scale_out):
    """vLLM issue 42019: rows of positions served from the prefix cache are not the target's. A
    round whose block (or the token before it) was served from the cache, as vLLM says in
    cached_tokens, is read by the prefixes instead (one-token completions compute what they ask
    for): here a second session decoding the same text as the first (its blocks cached), and a
    round sent twice. Without cached_tokens (vLLM started without --enable-prompt-tokens-details) no
    round could tell: auto does not take the route."""
    request = GenerateRequest(_draft().tokenize("speculate"), "greedy", seed=0, max_tokens=80)
    decoded = [g.token for g in toy_verifier(TARGET).generate(request)]
    target = decoded[:48]
    with _client(f"openai+{scale_out.url}", max_tokens=60) as client:
        client.server_info()
        first = client.generate("speculate").until_done()
        transport = client.transport
        assert transport.cached_block == 0  # one session alone never finds its block cached
        second = client.generate("speculate").until_done()  # the same text again: its blocks are cached
        assert transport.cached_block > 0
        prompt = transport.tokenizer.tokenize("speculate")
        tokens = prompt + decoded[: 63 - len(prompt)]
        assert len(tokens) == 63  # a block of 3 after them crosses the 64th token: a whole block
        before = transport.cached_block
        first_time = transport._top1(tokens + [5, 6, 7], len(tokens))
        again = transport._top1(tokens + [5, 6, 7], len(tokens))  # the same request: a round sent again
        assert transport.cached_block == before + 1 and again == first_time == decoded[63 - len(prompt):][:1]
    assert list(first.token_ids)[:48] == list(second.token_ids)[:48] == target
    assert not any(r["sampling_params"]["skip_reading_prefix_cache"] for r in _generate_rounds(scale_out))
    draft = _draft()
    with FakeOpenAIServer(TARGET, _text_of(draft), tokenize=lambda text: draft.tokenize(text), scale_out=True,
                          details=False) as silent:
        with _client(f"openai+{silent.url}") as client:
            assert list(client.generate("speculate").until_done().token_ids) == target
            assert client.transport.generates is False
        with _client(f"openai+{silent.url}?route=generate") as client:
            with pytest.raises(ConfigError, match="--enable-prompt-tokens-details"):
                client.server_info()


def test_a_long_prompt_is_prefilled_plainly_so_a_round_computes_only_its_block_and_the_tail(scale_out):
    """A round's prompt log-probabilities cost the LM head at every position the request computes
    (measured on vLLM's CPU build: a fresh 1,000-token context 10.6 s as a round, 2.5 s as a plain
    prefill, then 0.2 s a round). So a session's prompt of PREFILL_FROM tokens or more, and such an
    extension, is sent first as a plain request without log-probabilities; every round then computes
    rows for its block and the context's tail past the last whole KV block only."""
    from edgekit.transport._vllm_generate import PREFILL_FROM

    text = " ".join(["speculate"] * 80)
    with _client(f"openai+{scale_out.url}") as client:
        client.server_info()
        prompt = client.transport.tokenizer.tokenize(text)
        assert len(prompt) >= PREFILL_FROM + scale_out.BLOCK
        start = len(scale_out.requests)
        result = client.generate(text).until_done()
        assert client.transport.prefills == 1
    sent = scale_out.requests[start:]
    plain = [r for r in sent if "token_ids" in r and not r["sampling_params"].get("prompt_logprobs")]
    # before any round, all of the prompt but its last token: a prompt of whole KV blocks (800 tokens
    # here), cached whole, would leave the first round's row predicting its block's first token uncomputed
    assert len(prompt) % scale_out.BLOCK == 0
    assert [r["token_ids"] for r in plain] == [prompt[:-1]] and sent[0] is plain[0]
    assert client.transport.cached_block == 0
    rounds = scale_out.head_rows[-result.stats.rounds:]
    assert len(_generate_rounds(scale_out)) >= result.stats.rounds
    assert max(rounds) <= scale_out.BLOCK + 8, rounds  # never the prompt's rows again
    request = GenerateRequest(prompt, "greedy", seed=0, max_tokens=48)
    assert list(result.token_ids) == [g.token for g in toy_verifier(TARGET).generate(request)]
    transport = _handshake(scale_out.url)
    opened = transport.open_session(OpenRequest(prompt[:8], mode="greedy", seed=0, draft=_draft().fingerprint()))
    assert transport.prefills == 0  # a short prompt: its round's rows cost less than a request
    transport.extend_session(opened.session_id, 8, prompt[8:])
    assert transport.prefills == 1 and scale_out.requests[-1]["token_ids"] == prompt[:-1]
    with _client(f"openai+{scale_out.url}?route=prefixes") as client:  # K+1 requests would each compute it
        result = client.generate(text).until_done()
        assert client.transport.prefills == 1
    first = next(i for i, r in enumerate(scale_out.requests) if r.get("prompt", [])[:len(prompt) - 1] == prompt[:-1])
    assert scale_out.requests[first]["prompt"] == prompt[:-1] and "logprobs" not in scale_out.requests[first]
    assert list(result.token_ids) == [g.token for g in toy_verifier(TARGET).generate(request)]


def test_a_round_vllm_cannot_write_is_read_by_the_prefixes(scale_out):
    """vLLM 0.32 answers 400 where the answer would hold an infinite log-probability (a draft token
    the target rules out): that round goes by one-token completions of each prefix, which read the
    cache too; the output is still the target's own decoding."""
    with _client(f"openai+{scale_out.url}") as client:
        client.server_info()
        scale_out.fault = "unwritable"
        result = client.generate("speculate").until_done()
    prefixes = [r for r in scale_out.requests if r.get("echo") is False and r.get("max_tokens") == 1]
    assert len(prefixes) >= result.stats.rounds + 1  # K+1 completions a round
    request = GenerateRequest(_draft().tokenize("speculate"), "greedy", seed=0, max_tokens=48)
    assert list(result.token_ids) == [g.token for g in toy_verifier(TARGET).generate(request)]
