"""Issue 68, item 4: every seam a registry. A package installed beside edgekit adds a transport (by
URL scheme, `edgekit.transports`) and an engine (by kind, `edgekit.engines`) with entry points, as
it adds a scheduler (tests/unit/test_registry.py): here one package adds both, `edgekit serve --engine`
serves its engine in a process of its own, and a client reaches it through its scheme, end to end,
with no model downloaded (the engine is a toy target; the draft the toy's noisy twin)."""

from __future__ import annotations

import textwrap

import pytest
from _plugin_package import plugin_package
from _serve_process import serving

from edgekit import ClientConfig, ConfigError, EdgeClient, GenerationConfig
from edgekit.protocol import GenerateRequest
from edgekit.registry import ENGINES, TRANSPORTS, Registry
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_verifier
from edgekit.transport import connect, needs_tokenizer

# A target of its own (a toy LM named by its seed: "--model seed=5"), and a scheme that reaches an
# edgekit verifier as grpc does, counting its transports (what a package's own carrier would do).
PLUGIN = textwrap.dedent('''
    from edgekit.testing import ToyEngine, ToyLanguageModel
    from edgekit.transport import GrpcTransport

    built = []


    def engine(model, config, *, name=None):
        seed = int(dict(kv.split("=") for kv in model.split(","))["seed"])
        return ToyEngine(ToyLanguageModel(seed=seed, name=name or model), n_seq=config.max_sessions,
                         max_context=config.max_context)


    def transport(url, config, tokenizer=None):
        built.append(url)
        return GrpcTransport(url.partition("://")[2], config)


    def tokenized(url, config, tokenizer=None):
        return transport(url, config, tokenizer)


    tokenized.needs_tokenizer = True
''')




def test_the_shipped_transports_and_engines_are_registries():
    assert {"grpc", "grpcs", "openai+http", "openai+https", "sglang+http", "trtllm+http"} <= set(TRANSPORTS.names())
    assert "Triton" in next(e.doc for e in TRANSPORTS.entries() if e.name == "trtllm+http")
    assert ENGINES.names()[0] == "llama"
    assert needs_tokenizer("openai+http://127.0.0.1:8000") and not needs_tokenizer("127.0.0.1:50551")
    with pytest.raises(ConfigError, match="unknown verifier scheme 'vllm'.*openai\\+http://"):
        connect("vllm://127.0.0.1:8000", ClientConfig())
    with pytest.raises(ConfigError, match="engine must be one of llama.*got 'vllm'"):
        from edgekit import ServerConfig

        ServerConfig(engine="vllm")


def test_a_transport_registered_in_a_program_is_connected_by_its_scheme(monkeypatch):
    """`TRANSPORTS.register` in a program (as SCHEDULERS.register): a scheme of its own reaching the
    toy verifier in this process; the output is the toy target's own greedy decoding."""
    target = ToyLanguageModel(seed=7)
    registry = Registry("transport", "the verifier URL's scheme", "edgekit.test-nothing-installed", [])
    registry.register("toy", lambda url, config, tokenizer=None: toy_verifier(target, address=url), "the toy")
    # private: the registry connect() reads, swapped for the test's (entry points reread)
    import edgekit.transport._connect as connecting  # private: the registry connect() reads, swapped for the test's

    monkeypatch.setattr(connecting, "TRANSPORTS", registry)  # TRANSPORTS itself, without the test's scheme after
    draft = FakeDraftModel(ToyLanguageModel(seed=7, noise=1.0))
    gen = GenerationConfig(max_tokens=32, stop_at_eos=False, drafting="fixed", draft_k=4)
    pinned = ClientConfig(first_route="speculative")  # drafted, whatever the machine's step times say
    with EdgeClient("toy://here", draft=draft, generation=gen, config=pinned) as client:
        out = client.generate("a prompt").until_done()
        assert client.transport.address == "toy://here"
    request = GenerateRequest(draft.tokenize("a prompt"), "greedy", seed=0, max_tokens=32)
    assert list(out.token_ids) == [g.token for g in toy_verifier(target).generate(request)]
    assert 0 < out.stats.rounds < 32


def test_an_engine_and_a_transport_a_package_adds_are_served_and_used_end_to_end(tmp_path, monkeypatch):
    plugin = plugin_package(tmp_path, "toy_plugin", PLUGIN, {
        "edgekit.engines": {"toy-seeded": "toy_plugin:engine"},
        "edgekit.transports": {"relay": "toy_plugin:transport", "relay+tok": "toy_plugin:tokenized"}})
    monkeypatch.syspath_prepend(str(plugin))
    transports = Registry("transport", "the verifier URL's scheme", "edgekit.transports", [])  # found afresh
    assert {"relay", "relay+tok"} <= set(transports.names())
    assert "toy-seeded" in Registry("engine", "engine", "edgekit.engines", []).names()
    args = ["--engine", "toy-seeded", "--model", "seed=5", "--max-sessions", "2", "--max-context", "512"]
    with serving(args, plugin) as (address, lines):
        assert any(line.startswith("edgekit verifier: seed=5 on ") for line in lines), lines
        import edgekit.transport._connect as connecting  # private: the registry connect() reads, swapped

        monkeypatch.setattr(connecting, "TRANSPORTS", transports)
        import toy_plugin  # type: ignore[import-not-found]

        draft = FakeDraftModel(ToyLanguageModel(seed=5, noise=1.0, name="seed=5"))
        gen = GenerationConfig(max_tokens=40, stop_at_eos=False, drafting="fixed", draft_k=4)
        pinned = ClientConfig(first_route="speculative")  # drafted, whatever the machine's step times say
        with EdgeClient(f"relay://{address}", draft=draft, generation=gen, config=pinned) as client:
            assert client.server_info().target_model == "seed=5"
            spec = client.generate("a prompt").until_done()
            plain = client.generate_target_only("a prompt", max_tokens=40).until_done()
        assert toy_plugin.built == [f"relay://{address}"]
        assert spec.token_ids == plain.token_ids and 0 < spec.stats.rounds < 40
        request = GenerateRequest(draft.tokenize("a prompt"), "greedy", seed=0, max_tokens=40)
        assert list(spec.token_ids) == [g.token for g in toy_verifier(ToyLanguageModel(seed=5)).generate(request)]
        # a scheme whose builder says it drives the server through the draft's tokenizer
        assert connecting.needs_tokenizer(f"relay+tok://{address}") and not connecting.needs_tokenizer(
            f"relay://{address}")
        with pytest.raises(ConfigError, match="load the draft model first"):
            connect(f"relay+tok://{address}", ClientConfig())
