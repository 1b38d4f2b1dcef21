"""`edgekit probe` of a stock OpenAI-compatible server (a fake in vLLM's shape over a toy target),
priced on the gemma pair's widths: the pair's files must be in the cache."""

from __future__ import annotations

import pytest
from http_fakes import FakeOpenAIServer

from edgekit.testing import FakeDraftModel, ToyLanguageModel


def _toy_draft() -> FakeDraftModel:
    """The draft the toy target's stock server is probed with (the unit tests' pair)."""
    return FakeDraftModel(ToyLanguageModel(seed=11, noise=1.5))


@pytest.fixture()
def vllm():
    """An OpenAI-compatible server in vLLM's shape over the toy target, naming tokens as the draft does."""
    draft = _toy_draft()
    with FakeOpenAIServer(ToyLanguageModel(seed=11), lambda t: draft.token_bytes(t).decode(),
                          tokenize=draft.tokenize) as server:
        yield server


@pytest.mark.models  # the probe reads the gemma pair's headers for the widths it prices
def test_probing_a_stock_server_loads_the_draft_once_and_calibrates(vllm, monkeypatch):
    """`edgekit probe` needs the draft's tokenizer to reach a stock server at all; the
    calibration rounds draft on that same model rather than loading a second one."""
    from _transcript import PROBE, normalise_json, transcript
    from typer.testing import CliRunner

    import edgekit
    import edgekit.client._setup  # private: where a client loads its draft, swapped for the toy
    import edgekit.models
    from cli.app import app

    loaded = []

    def draft(path, *, name, n_ctx=None):  # type: ignore[no-untyped-def]
        loaded.append(name)
        return _toy_draft()

    monkeypatch.setattr(edgekit, "LlamaDraftModel", draft)  # where the probe loads it
    monkeypatch.setattr(edgekit.client._setup, "LlamaDraftModel", draft)  # private: where a client would
    monkeypatch.setattr(edgekit.models, "model_path", lambda name: name)
    r = CliRunner().invoke(app, ["probe", f"openai+{vllm.url}", "--pair", "gemma-270m", "--json",
                                 "--calibration-tokens", "16", "--pings", "3", "--tries", "1"])
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert len(loaded) == 1
    # the costs measured, on gemma's widths (the toy draft stands in for its draft)
    assert normalise_json(r.stdout, PROBE, {vllm.url: "<url>"}) == transcript("probe-stock-server-toy.json")
    out = __import__("json").loads(r.stdout)
    assert out["calibration"]["rounds"] > 0 and out["choice"]["upload"] == "tokens"  # a stock server takes no rows
