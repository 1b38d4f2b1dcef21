"""Lossless speculative decoding on the real gemma pair through a real gRPC verifier.

What these tests may expect, and why: the verifier runs exact numerics (the default), which
verifies every block in sub-batches measured at start-up, on this CPU and llama.cpp build, to
reproduce single-row logits bit for bit at each depth (single rows where nothing else does).
Target-only decoding is single rows. So greedy output is token-identical on any CPU, however
its kernels differ from another's; where the calibration is wrong, these tests are what says so.
Sampling is compared in distribution (KS and chi-square at 0.001 over 300 runs): the target's
probabilities computed along another path differ in the last bits, far below what 300 draws
can see."""

from __future__ import annotations

import itertools
import json
import threading

import numpy as np
import pytest
from _exact import ExactTarget, pit
from scipy.stats import chisquare

from edgekit import ClientConfig, EdgeClient, GenerationConfig, ServerConfig
from edgekit.protocol import Sampler

pytestmark = [pytest.mark.models, pytest.mark.numerics]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    "The three laws of thermodynamics are",
    "import numpy as np\n\ndef normalize(x):",
    "Le chat est assis sur",
    "Die Hauptstadt von Deutschland ist",
    "Q: What is the boiling point of water?\nA:",
    "SELECT name, age FROM users WHERE",
    "The quick brown fox",
    "To make a cup of tea, first",
    "In 1969, Neil Armstrong",
    "<html>\n<head>\n<title>",
    "El sol sale por el",
    "Photosynthesis is the process by which",
    "for i in range(10):\n    print(",
    "The best way to learn a new language is",
    "Dear Sir or Madam,\nI am writing to",
    "water water water water water",
]
MAX_TOKENS = 32

# Prompts past 256 tokens: there llama.cpp's CPU attention decodes one row another way than several,
# so only a depth-aware calibration keeps blocks exact (the first straddles the depth, the second is past it).
_CODE = """import json
import os
from dataclasses import dataclass, field


@dataclass
class Inventory:
    \"\"\"Items in a warehouse, by SKU, with their counts and the shelf they sit on.\"\"\"

    items: dict[str, int] = field(default_factory=dict)
    shelves: dict[str, str] = field(default_factory=dict)

    def add(self, sku: str, count: int, shelf: str) -> None:
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        self.items[sku] = self.items.get(sku, 0) + count
        self.shelves[sku] = shelf

    def remove(self, sku: str, count: int) -> int:
        held = self.items.get(sku, 0)
        taken = min(held, count)
        if taken == held:
            self.items.pop(sku, None)
            self.shelves.pop(sku, None)
        else:
            self.items[sku] = held - taken
        return taken

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"items": self.items, "shelves": self.shelves}, f)
        os.replace(tmp, path)
"""
LONG_PROMPTS = [
    _CODE + "\n    def total(self) -> int:\n",
    _CODE + _CODE.split("@dataclass")[1].replace("Inventory", "Ledger") + "\n\ndef merge(a, b):\n",
]


@pytest.fixture(scope="module")
def client(gemma_server, gemma_draft):
    c = EdgeClient(gemma_server.address, draft=gemma_draft,
                   generation=GenerationConfig(max_tokens=MAX_TOKENS, drafting="fixed"))
    yield c
    c.close()


@pytest.fixture(scope="module")
def target_only(client):
    return {p: client.generate_target_only(p).until_done().token_ids for p in PROMPTS}


def test_verifier_runs_exact_numerics(client):
    info = client.server_info()
    assert info.exact_numerics and info.invariant_batch >= 2


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_is_token_identical_to_target_only(client, target_only, k):
    mismatches = []
    drafted = accepted = 0
    for prompt in PROMPTS:
        final = client.generate(prompt, draft_k=k).until_done()
        drafted += final.stats.drafted
        accepted += final.stats.accepted
        if final.token_ids != target_only[prompt]:
            mismatches.append((prompt, final.token_ids, target_only[prompt]))
    assert not mismatches, f"{len(mismatches)} of {len(PROMPTS)} prompts differ, first: {mismatches[0]}"
    assert accepted > 0.3 * drafted  # the pair really speculates (measured: 0.72 at K=1, 0.48 at K=4)


def test_long_prompts_stay_token_identical_past_the_depth_where_kernels_change(client):
    """Blocks verified 250-700 tokens deep commit exactly what target-only decoding writes there."""
    for prompt in LONG_PROMPTS:
        n = len(client.tokenize(prompt))
        assert n > 240, n
        alone = client.generate_target_only(prompt, max_tokens=48).until_done().token_ids
        for k in (4, 8):
            spec = client.generate(prompt, draft_k=k, max_tokens=48).until_done()
            assert spec.token_ids == alone, (n, k)
            assert spec.stats.accepted > 0


@pytest.mark.parametrize("drafting", ["predictor", "p-min"])
def test_adaptive_windows_stay_token_identical(client, target_only, drafting):
    """Blocks cut by the shipped predictor or by p-min (empty blocks included,
    min_window 0 for p-min) commit exactly the target's greedy tokens."""
    from edgekit import ConfidenceThreshold

    drafted = []
    for prompt in PROMPTS[:8]:
        controller = ConfidenceThreshold(0.6, 8, min_window=0) if drafting == "p-min" else None
        # the predictor at its one operating threshold: its delay schedule may settle on one window
        # (a window of 1 where, as here, a round costs about a draft step)
        final = client.generate(prompt, drafting=drafting, max_window=8, controller=controller,
                                predictor_schedule=False).until_done()
        assert final.token_ids == target_only[prompt], prompt
        assert final.stats.drafting.startswith(drafting)
        drafted += [r.drafted for r in final.stats.rounds_detail]
    assert len(set(drafted)) > 2  # the windows really vary
    if drafting == "p-min":
        assert 0 in drafted


def test_concurrent_sessions_do_not_disturb_each_other(gemma_server, gemma_paths, target_only):
    """Eight clients at once share the verifier's KV cache (one sequence each), and their
    rounds are verified in shared batches: each still gets the target's own output."""
    from edgekit import LlamaDraftModel

    results: dict[str, tuple[int, ...]] = {}
    errors: list[BaseException] = []

    def run(prompts):
        try:
            draft = LlamaDraftModel(gemma_paths[0], n_ctx=512)
            with EdgeClient(
                gemma_server.address, draft=draft, generation=GenerationConfig(max_tokens=MAX_TOKENS, draft_k=4)
            ) as c:
                for p in prompts:
                    results[p] = c.generate(p).until_done().token_ids
            draft.close()
        except BaseException as exc:
            errors.append(exc)

    batches = gemma_server.service.core.batch_sizes.copy()
    threads = [threading.Thread(target=run, args=(PROMPTS[i::8][:1],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(results) == 8
    for p, toks in results.items():
        assert toks == target_only[p], p
    shared = gemma_server.service.core.batch_sizes - batches
    assert max(shared) > 1, shared  # rounds of several sessions went through the engine together


def test_sessions_parked_out_of_the_context_come_back_exact(gemma_paths, target_only):
    """Six sessions at once on a verifier whose context holds two: the others' KV is parked in host
    memory and loaded back round after round, and every answer is still the target's own. Exact
    because a context sequence is a stream of its own: a sequence loaded back holds its cells in
    the order, and with the values, it built them (llama.cpp's per-sequence state, copied whole)."""
    from edgekit import ClientConfig, LlamaDraftModel, ServerConfig
    from edgekit.verifier import VerifierServer

    config = ServerConfig(port=0, max_sessions=6, resident_sessions=2, max_context=256, max_block=8)
    server = VerifierServer(gemma_paths[1], config, name="gemma-3-270m").start()
    prompts = PROMPTS[:6]
    results: dict[str, tuple[int, ...]] = {}
    errors: list[BaseException] = []
    all_open = threading.Barrier(len(prompts), timeout=120)

    def run(prompt):
        try:
            draft = LlamaDraftModel(gemma_paths[0], n_ctx=256)
            gen = GenerationConfig(max_tokens=MAX_TOKENS, draft_k=4, drafting="fixed")
            with EdgeClient(server.address, draft=draft, generation=gen,
                            config=ClientConfig(first_route="speculative")) as c:
                all_open.wait()  # every session drafts at once: more than the context holds
                results[prompt] = c.generate(prompt).until_done().token_ids
            draft.close()
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        slots = server.engine.slots
    finally:
        server.stop()
    assert not errors, errors
    for p in prompts:
        assert results[p] == target_only[p], p
    assert slots.resident == 2 and slots.parks > 0 and slots.loads > 0, (slots.parks, slots.loads)


def test_greedy_rows_reduced_by_llama_cpp_stay_token_identical(gemma_paths, gemma_draft, target_only):
    """A verifier whose greedy rows llama.cpp reduces where they are made (`reduce_rows="llama"`, as a
    GPU target does by default): each answer is the target's own (the host-reducing verifier's
    target-only decoding), in exact numerics, several sessions verified together."""
    from edgekit.verifier import VerifierServer

    config = ServerConfig(port=0, max_sessions=4, max_context=256, max_block=8, reduce_rows="llama")
    server = VerifierServer(gemma_paths[1], config, name="gemma-3-270m").start()
    try:
        assert server.engine.reduces_in_llama
        gen = GenerationConfig(max_tokens=MAX_TOKENS, draft_k=4, drafting="fixed")
        with EdgeClient(server.address, draft=gemma_draft, generation=gen,
                        config=ClientConfig(first_route="speculative")) as c:
            for prompt in PROMPTS[:6]:
                final = c.generate(prompt).until_done()
                assert final.token_ids == target_only[prompt], prompt
                assert final.stats.drafted > 0  # verified in rounds, not streamed target-only
            assert c.generate_target_only(PROMPTS[6]).until_done().token_ids == target_only[PROMPTS[6]]
    finally:
        server.stop()


def test_prefix_is_reused_between_rounds(client, gemma_server):
    """After every round the verifier holds all committed tokens but the last in KV:
    a round decodes only that token and the block."""
    session = client.session(draft_k=4)
    session.open(client.tokenize("Reuse the prefix, please: one, two, three,"))
    try:
        state = gemma_server.service.sessions.get(session.session_id)
        for _ in range(5):
            decoded = state.decoded
            _, stats, _ = session.round(4)
            assert state.tokens == session.tokens
            assert state.decoded - decoded == stats.drafted + 1  # the last committed token and the block
            assert gemma_server.engine.cached(state.seq) >= len(session.tokens) - 1
    finally:
        session.close()


# -- speculative sampling -----------------------------------------------------------

SAMPLING_PROMPT = "The capital of France is"
SAMPLING_RUNS = 300
ALPHA = 1e-3


def test_speculative_sampling_matches_the_target_distribution(client, gemma_paths):
    """300 seeded runs; the first two committed tokens of each are tested against
    the exact target distribution, significance 0.001 for each of two tests:

    - Kolmogorov-Smirnov on the randomised PIT of x1 under p(x1) and of x2 under
      p(x2 | x1): 600 values that are i.i.d. uniform if and only if the output is
      distributed as the target (Rosenblatt), using every run;
    - chi-square goodness of fit of x1 over tokens expected at least 5 times,
      the rest pooled.

    The draft samples at temperature 2.0 against a target at 1.0, so its
    distribution is far from the target's and many drafts are rejected: the
    residual resampling carries much of the output. K=2 and max_tokens=3 put
    both tokens in the first round (accepted, resampled or bonus).
    """
    from scipy.stats import kstest

    prompt = client.tokenize(SAMPLING_PROMPT)
    exact = ExactTarget(gemma_paths[1], prompt, Sampler())
    rng = np.random.default_rng(12345)
    us, firsts = [], []
    drafted = accepted = 0
    try:
        for seed in range(SAMPLING_RUNS):
            final = client.generate(
                prompt, mode="sample", temperature=1.0, draft_temperature=2.0, draft_k=2, max_tokens=3, seed=seed,
                stop_at_eos=False,
            ).until_done()
            drafted += final.stats.drafted
            accepted += final.stats.accepted
            x1, x2 = final.token_ids[0], final.token_ids[1]
            firsts.append(x1)
            us.append(pit(exact.probs(), x1, rng.random()))
            us.append(pit(exact.probs([x1]), x2, rng.random()))
        p1 = exact.probs()
    finally:
        exact.close()
    assert 0.2 < accepted / drafted < 0.9, f"acceptance {accepted / drafted:.2f}: the test must see both outcomes"
    ks = kstest(us, "uniform")
    assert ks.pvalue > ALPHA, ks
    bins = np.flatnonzero(SAMPLING_RUNS * p1 >= 5)
    observed = [firsts.count(int(b)) for b in bins]
    expected = [SAMPLING_RUNS * p1[b] for b in bins]
    chi = chisquare(observed + [SAMPLING_RUNS - sum(observed)], expected + [SAMPLING_RUNS - sum(expected)])
    assert len(bins) >= 4
    assert chi.pvalue > ALPHA, (chi, list(zip(bins.tolist(), observed, np.round(expected, 1).tolist())))


def test_calibration_covers_every_depth_a_session_reaches():
    # private: exact numerics' calibration, checked against llama.cpp itself
    # private: exact numerics' calibration, checked against llama.cpp itself
    from edgekit.verifier.engine._llama import calibration_depths

    depths = calibration_depths(4096, 17)
    assert depths[:4] == (4, 128, 192, 224) and all(b > a for a, b in itertools.pairwise(depths))
    assert depths[-1] + 17 < 4096 and depths[-1] > 4096 / 1.5 - 17  # no band wider than half again
    assert calibration_depths(16, 17) == (0,)


def test_rows_per_call_are_the_fewest_any_touched_band_allows():
    # private: exact numerics' calibration, checked against llama.cpp itself
    from edgekit.verifier.engine._llama import bands_between, rows_exact_between

    table = ((4, 7), (64, 7), (128, 6), (256, 1), (512, 3))
    assert rows_exact_between(table, 0, 9) == 7  # band [0, 64): min(7, 7)
    assert rows_exact_between(table, 60, 69) == 6  # touches [64, 128): min(7, 6)
    assert rows_exact_between(table, 130, 139) == 1  # [128, 256) ends where only single rows are exact
    assert rows_exact_between(table, 600, 609) == 3  # the last band: its own
    assert rows_exact_between(table, 500, 520) == 1
    assert bands_between(table, 60, 69) == [0, 1] and bands_between(table, 600, 609) == [4]


def test_the_engine_measured_its_exact_batch_at_every_depth(gemma_server):
    from edgekit.verifier.engine._llama import calibration_depths  # private: the depths it calibrates at

    engine = gemma_server.engine  # max_context 2048, max_block 16
    table = engine.invariant_batches
    measured = tuple(d for d, _ in table)
    assert measured == calibration_depths(2048, 17)[: len(measured)]
    rows = [n for _, n in table]
    assert rows[0] == engine.invariant_batch >= 2 and all(1 <= b <= a <= 17 for a, b in itertools.pairwise(rows))
    assert rows[-1] == 1 or measured[-1] == calibration_depths(2048, 17)[-1]  # stops only where single rows


def test_the_exact_calibration_is_kept_and_reused_and_walks_every_depth_on_one_thread(gemma_paths, tmp_path,
                                                                                      monkeypatch):
    """One thread splits no attention: every depth stays batchable, so the calibration walks them all
    (a text long enough for the deepest); a second start reads the table back; a spoiled file is measured again."""
    # private: exact numerics' calibration, checked against llama.cpp itself
    from edgekit.verifier.engine import _llama
    from edgekit.verifier.engine._llama import LlamaEngine, calibration_depths

    engine = LlamaEngine(str(gemma_paths[1]), max_context=1024, n_seq=1, max_block=32, threads=1, cache_dir=tmp_path)
    table = engine.invariant_batches
    engine.close()
    assert table[-1][1] == 1 or tuple(d for d, _ in table) == calibration_depths(1024, 33)
    kept = list(tmp_path.glob("invariant-batches-*.json"))
    assert len(kept) == 1

    def measured(*args, **kwargs):
        raise AssertionError("measured again although a table was kept")

    monkeypatch.setattr(_llama, "calibrate_invariant_batches", measured)
    again = LlamaEngine(str(gemma_paths[1]), max_context=1024, n_seq=1, max_block=32, threads=1, cache_dir=tmp_path)
    assert again.invariant_batches == table
    again.close()
    kept[0].write_text("{not json")
    monkeypatch.undo()
    third = LlamaEngine(str(gemma_paths[1]), max_context=1024, n_seq=1, max_block=32, threads=1, cache_dir=tmp_path)
    assert third.invariant_batches == table
    assert json.loads(kept[0].read_text())["value"] == [list(r) for r in table]  # stored whole again
    third.close()
