"""TensorRT-LLM on Triton (`trtllm+http://`): the transport against a local server that follows the
tensorrt_llm model's documented tensors over a toy target (tests/triton_fake.py). Nothing here runs
TensorRT-LLM or Triton: both need an NVIDIA GPU."""

from __future__ import annotations

import pytest
from triton_fake import FakeTritonServer, infer_inputs

from edgekit import (
    ClientConfig,
    ConfigError,
    EdgeClient,
    GenerationConfig,
    LimitExceededError,
    VerifierError,
    VerifierUnavailableError,
)
from edgekit.protocol import GenerateRequest, OpenRequest, Sampler
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_client, toy_verifier
from edgekit.transport import TritonTransport, connect, needs_tokenizer

TARGET = ToyLanguageModel(seed=11)
TIMEOUT = 30.0  # a deadline for calls that answer in milliseconds: generous, so a loaded machine never meets it


def _draft(noise: float = 1.5, target: ToyLanguageModel = TARGET) -> FakeDraftModel:
    return FakeDraftModel(ToyLanguageModel(seed=target.seed, noise=noise, eos_bias=target.eos_bias))


def _client(url: str, draft: FakeDraftModel | None = None, *, client: ClientConfig | None = None,
            **gen: object) -> EdgeClient:
    config = GenerationConfig(**({"max_tokens": 48, "stop_at_eos": False, "drafting": "fixed", "draft_k": 5} | gen))
    return EdgeClient(url, draft=draft or _draft(), generation=config,
                      config=client or ClientConfig(timeout=TIMEOUT))


def _targets_own(max_tokens: int = 48, target: ToyLanguageModel = TARGET) -> list[int]:
    request = GenerateRequest(_draft(target=target).tokenize("speculate"), "greedy", seed=0, max_tokens=max_tokens)
    return [g.token for g in toy_verifier(target).generate(request)]


@pytest.mark.parametrize("exclude", [False, True], ids=["input-in-output", "input-excluded"])
@pytest.mark.parametrize("declares", [True, False], ids=["declared", "undeclared"])
def test_greedy_through_triton_is_the_targets_own_decoding_one_request_a_round(exclude, declares):
    """Blocks of 5 go as draft_input_ids; the engine's answer (the target's greedy tokens) accepts
    some whole, cuts others short, and the output is the target's own greedy decoding, one infer
    request a round, whether output_ids holds the input or not, and whether the model's
    configuration says which (else the first answer settles it)."""
    with FakeTritonServer(TARGET, exclude_input_in_output=exclude, declares=declares) as triton:
        for noise in (0.5, 1.5):  # a draft close to the target (blocks accepted whole), a noisier one
            with _client(f"trtllm+{triton.url}", _draft(noise)) as client:
                info = client.server_info()
                before = len(triton.infers)
                result = client.generate("speculate").until_done()
            assert list(result.token_ids) == _targets_own()
            rounds = triton.infers[before:]
            assert len(rounds) == result.stats.rounds < 48  # one request a round, several tokens each
            prompt = len(_draft().tokenize("speculate"))
            for r in rounds:
                sent = infer_inputs(r)
                block = sent["draft_input_ids"]
                assert 1 <= len(block) <= 5 and sent["request_output_len"] == [len(block) + 1]
                assert sent["input_lengths"] == [len(sent["input_ids"])] and len(sent["input_ids"]) >= prompt
                assert sent["runtime_top_k"] == sent["beam_width"] == [1] and sent["streaming"] == [False]
                assert "end_id" not in sent  # a round reads the target's token at every position
                assert r["outputs"] == [{"name": "output_ids"}, {"name": "sequence_length"}]
        accepted = triton.accepted
        assert any(a == k for a, k in accepted) and any(a < k for a, k in accepted)  # whole blocks and cut ones
    assert (info.backend, info.modes, info.upload_protocols, info.target_model, info.max_block) == (
        "trtllm", ("greedy",), ("tokens",), "tensorrt_llm", 16
    )
    assert info.tokenizer_check == ("none (the tensorrt_llm model takes token ids only; the ensemble's "
                                    "preprocessing model, if deployed, is not asked)")
    assert client.transport.exclude_input is exclude


@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_end_of_text_in_a_round_is_the_targets_and_what_follows_it_too(stop_at_eos):
    """A target that ends its text now and then: rounds send no end_id, so the engine names the
    target's token at every block position, the end of text and those after it included; the
    output is the target's own, ending at the first end of text where the session stops there."""
    target = ToyLanguageModel(seed=11, eos_bias=3.0)  # its greedy text has end-of-text at 16, 19, 33 and 47
    with FakeTritonServer(target) as triton, \
            _client(f"trtllm+{triton.url}", _draft(0.5, target), stop_at_eos=stop_at_eos) as client:
        result = client.generate("speculate").until_done()
    with toy_client(target, draft=_draft(0.5, target).lm, max_tokens=48, stop_at_eos=stop_at_eos, drafting="fixed",
                    draft_k=5) as reference:
        expected = reference.generate("speculate").until_done()
    assert list(result.token_ids) == list(expected.token_ids)
    assert (target.eos in result.token_ids[:-1]) is not stop_at_eos


@pytest.mark.parametrize("end_in_output", [False, True], ids=["end-left-out", "end-and-padding"])
@pytest.mark.parametrize("exclude", [False, True], ids=["input-in-output", "input-excluded"])
def test_target_only_generation_is_the_engines_own_and_ends_at_end_of_text(exclude, end_in_output):
    """Target-only generation asks for the tokens with the draft's end of sequence as end_id: the
    answer ends there, whether the engine leaves the end out or keeps it and pads after it."""
    target = ToyLanguageModel(seed=11, eos_bias=3.0)
    draft = _draft(0.5, target)
    with FakeTritonServer(target, exclude_input_in_output=exclude, end_in_output=end_in_output) as triton:
        transport = connect(f"trtllm+{triton.url}", ClientConfig(timeout=TIMEOUT), draft)
        transport.handshake(draft.fingerprint(), draft_model="toy", draft_hidden_size=0)
        prompt = draft.tokenize("speculate")
        tokens = list(transport.generate(GenerateRequest(prompt, "greedy", seed=0, max_tokens=40)))
        sent = infer_inputs(triton.infers[-1])
        short = list(transport.generate(GenerateRequest(prompt, "greedy", seed=0, max_tokens=10)))
    assert [t.token for t in tokens] == _targets_own(40, target) == target.greedy(prompt, 17)
    assert tokens[-1].finish_reason == "eos" and len(tokens) == 17
    assert sent["end_id"] == sent["pad_id"] == [target.eos] and sent["request_output_len"] == [40]
    assert "draft_input_ids" not in sent
    assert [t.token for t in short] == target.greedy(prompt, 10) and short[-1].finish_reason == "length"


def test_a_block_past_the_engines_max_draft_len_is_a_limit_naming_the_url_option():
    """No Triton endpoint reports the engine's --max_draft_len: the URL says it, and the client drafts
    no longer. Where it does not, a longer block is refused by the engine, in its words."""
    with FakeTritonServer(TARGET, max_draft_len=3) as triton:
        with _client(f"trtllm+{triton.url}", client=ClientConfig(timeout=TIMEOUT, retry_for=0)) as client:
            with pytest.raises(LimitExceededError, match=r"takes at most 3 draft tokens a round \(its engine's "
                                                         r"max_draft_len\) and was sent 5; .*\?max_draft_len=3. It "
                                                         r"said: Draft tokens length \(5\) exceeds maximum draft"):
                client.generate("speculate").until_done()
        with _client(f"trtllm+{triton.url}?max_draft_len=3") as client:
            assert client.server_info().max_block == 3
            before = len(triton.infers)
            result = client.generate("speculate").until_done()
        assert list(result.token_ids) == _targets_own()
        assert all(1 <= len(infer_inputs(r)["draft_input_ids"]) <= 3 for r in triton.infers[before:])


def test_an_engine_cut_short_at_its_max_seq_len_is_a_limit():
    with FakeTritonServer(TARGET, max_seq_len=30) as triton, \
            _client(f"trtllm+{triton.url}", client=ClientConfig(timeout=TIMEOUT, retry_for=0)) as client:
        with pytest.raises(LimitExceededError, match="reached its engine's maximum length .*--max_seq_len"):
            client.generate("speculate").until_done()


def test_a_connection_dropped_mid_answer_is_retried_and_the_answer_is_the_same():
    with FakeTritonServer(TARGET) as triton:
        with _client(f"trtllm+{triton.url}", client=ClientConfig(timeout=TIMEOUT, retry_initial=0.01)) as client:
            client.server_info()
            triton.fault = "drop"  # the next request's connection closes unanswered, once
            result = client.generate("speculate").until_done()
        assert triton.fault is None  # it was dropped
        assert len(triton.infers) == result.stats.rounds  # answered: one a round
        assert len([r for r in triton.requests if "inputs" in r]) == result.stats.rounds + 1  # and the dropped one
    assert list(result.token_ids) == _targets_own()


def test_a_server_failure_maps_into_the_error_tree():
    with FakeTritonServer(TARGET) as triton, \
            _client(f"trtllm+{triton.url}", client=ClientConfig(timeout=TIMEOUT, retry_for=0)) as client:
        client.server_info()
        triton.fault = "http500"
        with pytest.raises(VerifierError, match="Triton server at http://127.0.0.1:\\d+ answered verifying a "
                                                "block with HTTP 500: CUDA out of memory"):
            client.generate("x").until_done()


def test_a_model_it_does_not_serve_is_refused_naming_those_it_does():
    with FakeTritonServer(TARGET) as triton, _client(f"trtllm+{triton.url}?model=llama") as client:
        with pytest.raises(ConfigError, match=r"serves no model 'llama'; it serves: tensorrt_llm \(READY\), "
                                              r"ensemble \(READY\), preprocessing \(READY\), postprocessing "
                                              r"\(READY\). .*\?model=NAME"):
            client.server_info()


def test_a_model_without_draft_input_ids_is_refused_saying_which_model_verifies():
    with FakeTritonServer(TARGET) as triton, _client(f"trtllm+{triton.url}?model=ensemble") as client:
        with pytest.raises(ConfigError, match="model 'ensemble' at .* takes no draft_input_ids \\(it takes end_id, "
                                              "max_tokens, text_input\\): .*tensorrt_llm model.*--max_draft_len N"):
            client.server_info()


def test_a_server_not_ready_is_unavailable():
    with FakeTritonServer(TARGET) as triton, \
            _client(f"trtllm+{triton.url}", client=ClientConfig(timeout=TIMEOUT, retry_for=0)) as client:
        triton.ready = False
        with pytest.raises(VerifierUnavailableError, match="is up but not ready"):
            client.server_info()


def test_sampling_is_refused_saying_verification_here_is_greedy():
    with FakeTritonServer(TARGET) as triton:
        with _client(f"trtllm+{triton.url}", mode="sample") as client:
            with pytest.raises(ConfigError, match="does not support 'sample' acceptance \\(it offers: greedy\\)"):
                client.generate("x").until_done()
        draft = _draft()
        transport = connect(f"trtllm+{triton.url}", ClientConfig(timeout=TIMEOUT), draft)
        transport.handshake(draft.fingerprint(), draft_model="toy", draft_hidden_size=0)
        with pytest.raises(ConfigError, match="verifies greedily: TensorRT-LLM's external-draft verification .* "
                                              "greedy acceptance only \\(its draft_logits-based acceptance, which "
                                              "could sample, was not built\\)"):
            transport.open_session(OpenRequest(draft.tokenize("x"), mode="sample", seed=0, sampler=Sampler(top_k=5),
                                               draft=draft.fingerprint()))


def test_the_scheme_picks_the_transport_and_its_options():
    draft = _draft()
    config = ClientConfig()
    assert needs_tokenizer("trtllm+http://127.0.0.1:8000")
    plain = connect("trtllm+http://127.0.0.1:8000", config, draft)
    assert isinstance(plain, TritonTransport) and plain.address == "http://127.0.0.1:8000"
    assert (plain.served, plain.max_draft_len, plain.max_block) == ("tensorrt_llm", None, 16)
    named = connect("trtllm+https://gpu.example.org?model=llama_trt&max_draft_len=4", config, draft)
    assert isinstance(named, TritonTransport) and named.address == "https://gpu.example.org"
    assert (named.served, named.max_draft_len, named.max_block) == ("llama_trt", 4, 4)
    for bad in ("?max_draft_len=0", "?max_draft_len=four", "?model=", "?route=generate"):
        with pytest.raises(ConfigError, match="a trtllm verifier takes \\?model=NAME .* and max_draft_len=N"):
            connect(f"trtllm+http://127.0.0.1:8000{bad}", config, draft)
    with pytest.raises(ConfigError, match="driven through the draft's tokenizer; load the draft model first"):
        connect("trtllm+http://127.0.0.1:8000", config)
    with pytest.raises(ConfigError, match="unknown verifier scheme 'trtllm\\+grpc'.*trtllm\\+http://"):
        connect("trtllm+grpc://127.0.0.1:8001", config, draft)


def test_a_token_goes_to_a_remote_triton_over_tls_only():
    draft = _draft()
    secret = ClientConfig(token="s3cret")
    with pytest.raises(ConfigError, match="refusing to send the verifier's token in plaintext to gpu.example.org.*"
                                          "trtllm\\+https://"):
        connect("trtllm+http://gpu.example.org:8000", secret, draft)
    assert isinstance(connect("trtllm+https://gpu.example.org:8000", secret, draft), TritonTransport)
    assert isinstance(connect("trtllm+http://127.0.0.1:8000", secret, draft), TritonTransport)
    insecure = ClientConfig(token="s3cret", insecure=True)
    assert isinstance(connect("trtllm+http://gpu.example.org:8000", insecure, draft), TritonTransport)
