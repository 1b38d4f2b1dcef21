"""A user's own models, end to end through the CLI: a draft named by a Hub reference (served by a
hub on loopback), by an Ollama reference (a store laid out on disk as Ollama writes it) and by a
path drafts against a verifier, and its output equals the target's own greedy decoding; a target
named by reference is served locally; a wrong pair is refused before a weight loads; a target
without a draft gets the smallest draft of its tokenizer on this machine, suggested or (--yes) used.

The draft is the registry's gemma draft each time, reached through each source: the hub serves
the file where it lies, the Ollama store hard-links it. Greedy speculative decoding is lossless
against exact numerics, so each output is compared token for token with target-only decoding."""

from __future__ import annotations

import json
import re

import pytest
from _model_files import add_ollama_model
from hub_fake import FakeHub, use_hub
from typer.testing import CliRunner

from edgekit.cli.app import app
from edgekit.errors import ConfigError, IncompatibleModelsError
from edgekit.models import cache_dir, get_model

pytestmark = pytest.mark.models

runner = CliRunner()
PROMPT = "def fibonacci(n):"
HUB_DRAFT = "hf:edgekit-test/gemma-3-270m-GGUF:Q4_0"


@pytest.fixture()
def hub(tmp_path, monkeypatch, gemma_paths):
    """The hub on loopback, serving the registry's gemma draft as edgekit-test/gemma-3-270m-GGUF."""
    with FakeHub() as fake:
        use_hub(monkeypatch, fake.url, tmp_path / "hf")
        fake.add_repo("edgekit-test/gemma-3-270m-GGUF", {"README.md": b"# gemma\n",
                                                         "gemma-3-270m-Q4_0.gguf": gemma_paths[0]})
        yield fake


@pytest.fixture()
def ollama(tmp_path, monkeypatch, gemma_paths):
    """An Ollama store holding the gemma draft as gemma-draft:latest (hard-linked, digest from the cache's sidecar)."""
    store = tmp_path / "ollama"
    sha = json.loads((gemma_paths[0].parent / (gemma_paths[0].name + ".json")).read_text())["sha256"]
    add_ollama_model(store, gemma_paths[0], "gemma-draft", family="gemma3", quant="Q4_0", sha256=sha, link=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    return store


def _generate(*args: str) -> dict:
    """`edgekit generate --json` drafting (its first "auto" answer's route pinned: these are tests of the draft)."""
    r = runner.invoke(app, ["generate", "--prompt", PROMPT, "-n", "16", "--json", *args],
                      env={"EDGEKIT_FIRST_ROUTE": "speculative"})
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def reference(gemma_server) -> list[int]:
    """The target's own greedy decoding of PROMPT."""
    out = runner.invoke(app, ["generate", "--prompt", PROMPT, "-n", "16", "--json", "--baseline", "target-only",
                              "--verifier", gemma_server.address, "--pair", "gemma-270m"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)["token_ids"]


def test_a_draft_from_the_hub_drafts_against_a_verifier(hub, gemma_server, reference):
    out = _generate("--draft", HUB_DRAFT, "--verifier", gemma_server.address)
    assert out["token_ids"] == reference and out["metrics"]["rounds"] < 16
    assert out["draft_model"] == "edgekit-test/gemma-3-270m-GGUF:Q4_0"
    assert [s.path for s in hub.seen("GET") if s.kind == "cdn"]  # it came through the hub
    again = _generate("--draft", HUB_DRAFT, "--verifier", gemma_server.address)
    assert again["token_ids"] == reference
    assert len([s for s in hub.seen("GET") if s.kind == "cdn"]) == 1  # the second run read the Hub's cache


def test_chat_drafts_with_a_model_from_ollamas_store(ollama, gemma_server):
    r = runner.invoke(app, ["chat", "--draft", "ollama:gemma-draft", "--verifier", gemma_server.address,
                            "--prompt", "Name a colour.", "--json", "--max-tokens", "8"])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout.splitlines()[0])
    assert answer["metrics"]["completion_tokens"] > 0 and answer["metrics"]["rounds"] >= 1


def test_drafts_from_ollama_and_from_a_path_equal_target_only(ollama, gemma_server, gemma_paths, reference):
    assert _generate("--draft", "ollama:gemma-draft", "--verifier", gemma_server.address)["token_ids"] == reference
    assert _generate("--draft", str(gemma_paths[0]), "--verifier", gemma_server.address)["token_ids"] == reference


def test_a_target_by_reference_is_served_locally_and_stays_lossless(ollama, gemma_paths, reference):
    out = _generate("--draft", "ollama:gemma-draft", "--target", str(gemma_paths[1]))
    assert out["token_ids"] == reference


def test_a_wrong_pair_is_refused_before_any_weights_load(gemma_paths, monkeypatch):
    from edgekit.runtime import _llama  # private: llama.cpp's loads counted where they happen

    loaded = []
    monkeypatch.setattr(_llama.LlamaModel, "__init__", lambda self, *a, **k: loaded.append(a))
    smollm = cache_dir() / get_model("smollm2-135m-instruct").filename
    if not smollm.is_file():
        pytest.skip("smollm2-135m-instruct is not pulled (make models-test pulls it)")
    r = runner.invoke(app, ["generate", "--prompt", PROMPT, "--draft", str(smollm), "--target", str(gemma_paths[1])])
    assert isinstance(r.exception, IncompatibleModelsError) and loaded == []  # (the entry point prints it)
    # Both files are registry models': named as the registry names them (models/refs.py)
    assert "draft smollm2-135m-instruct " in str(r.exception) and "target gemma-3-270m:" in str(r.exception)


def test_a_wrong_draft_for_a_remote_verifier_is_refused_before_its_weights_load(gemma_server, monkeypatch):
    from edgekit.runtime import _llama  # private: llama.cpp's loads counted where they happen

    smollm = cache_dir() / get_model("smollm2-135m-instruct").filename
    if not smollm.is_file():
        pytest.skip("smollm2-135m-instruct is not pulled (make models-test pulls it)")
    real, weights = _llama.LlamaModel.__init__, []

    def init(self, *a, **k):  # the vocabulary alone may load; weights may not
        if not k.get("vocab_only"):
            weights.append(a)
        real(self, *a, **k)

    monkeypatch.setattr(_llama.LlamaModel, "__init__", init)
    r = runner.invoke(app, ["generate", "--prompt", PROMPT, "--draft", str(smollm), "--verifier", gemma_server.address])
    assert isinstance(r.exception, IncompatibleModelsError) and weights == [], r.output
    assert "smollm2-135m-instruct" in str(r.exception) and "gemma-3-270m" in str(r.exception)
    assert "before loading the draft's weights" in str(r.exception)


def test_a_target_without_a_draft_gets_the_smallest_of_its_tokenizer(tmp_path, monkeypatch, gemma_paths, reference):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))  # the registry cache alone
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    r = runner.invoke(app, ["generate", "--prompt", PROMPT, "-n", "16", "--target", str(gemma_paths[1])])
    assert isinstance(r.exception, ConfigError)
    message = str(r.exception)
    assert re.search(r"no --draft given: gemma-3-270m-q4_0 \(\d+ MB\) is the smallest model of .* tokenizer", message)
    assert "--yes" in message
    out = _generate("--target", str(gemma_paths[1]), "--yes")
    assert out["token_ids"] == reference


def test_models_list_shows_every_source_and_rm_removes_a_hub_model(hub, ollama, gemma_server):
    _generate("--draft", HUB_DRAFT, "--verifier", gemma_server.address)  # fetched into the Hub's cache
    r = runner.invoke(app, ["models", "list", "--json"])
    assert r.exit_code == 0, r.output
    local = {m["ref"]: m for m in json.loads(r.stdout)["local"]}
    hub_ref, target = "hf:edgekit-test/gemma-3-270m-GGUF/gemma-3-270m-Q4_0.gguf", "gemma-3-270m"
    assert {hub_ref, "ollama:gemma-draft:latest", "gemma-3-270m-q4_0", target} <= local.keys()
    assert {local[r]["source"] for r in (hub_ref, "ollama:gemma-draft:latest", target)} == {"hf", "ollama", "registry"}
    for ref in (hub_ref, "ollama:gemma-draft:latest", "gemma-3-270m-q4_0"):  # one tokenizer: each drafts for the target
        assert target in local[ref]["drafts_for"] and local[ref]["tokenizer"] == local[target]["tokenizer"]
    assert local[target]["drafts_for"] == []  # nothing here is larger with its tokenizer
    r = runner.invoke(app, ["models", "rm", HUB_DRAFT])
    assert r.exit_code == 0, r.output
    link, blob = r.stdout.splitlines()  # the snapshot's link, then the blob no other revision holds
    assert link.startswith("removed ") and link.endswith("/gemma-3-270m-Q4_0.gguf") and "/blobs/" in blob
    r = runner.invoke(app, ["models", "list", "--json"])
    assert hub_ref not in {m["ref"] for m in json.loads(r.stdout)["local"]}
    r = runner.invoke(app, ["models", "rm", "ollama:gemma-draft"])
    assert isinstance(r.exception, ConfigError) and "ollama rm gemma-draft" in str(r.exception)


def test_chat_drafts_with_a_model_from_the_hub(hub, gemma_server):
    r = runner.invoke(app, ["chat", "--draft", HUB_DRAFT, "--verifier", gemma_server.address,
                            "--prompt", "Name a colour.", "--json", "--max-tokens", "8"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[0])["metrics"]["completion_tokens"] > 0


def test_profile_times_a_draft_named_by_reference(ollama):
    r = runner.invoke(app, ["profile", "--draft", "ollama:gemma-draft", "--predictor", "none", "--steps", "20",
                            "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["draft"] == "gemma-draft:latest" and out["n_vocab"] == 262144


def test_serve_takes_a_model_by_reference(ollama, gemma_draft):
    """`edgekit serve --model ollama:...`: the verifier serves the blob in Ollama's store, under its name."""
    import os
    import signal
    import subprocess
    import sys

    from edgekit.transport import GrpcTransport

    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.app", "serve", "--model", "ollama:gemma-draft", "--port", "0",
         "--max-sessions", "1", "--max-context", "256"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ},
    )
    try:
        line = ""
        while not line.startswith("edgekit verifier: "):  # the announcement, once it serves
            line = proc.stderr.readline()
            assert line, "serve ended before it announced itself"
        assert line.startswith("edgekit verifier: gemma-draft:latest on 127.0.0.1:"), line
        address = re.search(r" on (127\.0\.0\.1:\d+) ", line).group(1)
        with GrpcTransport(address) as t:
            info = t.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640)
            assert info.target_model == "gemma-draft:latest" and info.target_fingerprint.same_tokenizer(
                gemma_draft.fingerprint())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_probe_and_plan_take_a_draft_by_reference(ollama, gemma_server, tmp_path):
    r = runner.invoke(app, ["probe", gemma_server.address, "--draft", "ollama:gemma-draft", "--json",
                            "--calibration-tokens", "16"])
    assert r.exit_code == 0, r.output
    probed = json.loads(r.stdout)
    assert probed["costs"]["measured"] and probed["costs"]["draft_step_ms"] > 0
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nThe capital of France is\n")
    r = runner.invoke(app, ["plan", str(prompts), "--draft", "ollama:gemma-draft", "--verifier", gemma_server.address,
                            "--max-tokens", "8", "--acceptance", "0.7", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["window"] >= 1
