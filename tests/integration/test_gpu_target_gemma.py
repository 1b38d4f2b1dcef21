"""The GPU target where no weights can be downloaded (benchmarks/gpu/make_target.py, issue 51 item 1),
on the CPU as CI runs it: the shapes are the published models', and a toy-sized target written with
gemma's tokenizer, F16 and requantized to Q4_K_M, loads in llama.cpp, serves behind the verifier,
and the gemma draft drafts for it (speculative output equals the target's own: exact numerics)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.models
@pytest.mark.timeout(600)
def test_a_toy_target_loads_serves_and_the_pairs_draft_drafts_for_it(gpu_toy_target, gemma_paths):
    from edgekit import EdgeClient, GenerationConfig, LlamaDraftModel, ServerConfig
    from edgekit.models.compat import check_pair
    from edgekit.verifier import VerifierServer

    made = gpu_toy_target
    assert [m["type"] for m in made] == ["f16", "q4_k_m"]
    f16, q4 = (Path(m["path"]) for m in made)
    assert made[0]["n_vocab"] == 262_144 and made[0]["parameters"] > 2 * 262_144 * 64
    assert q4.stat().st_size < 0.6 * f16.stat().st_size  # requantized: the matrices at ~4.5 bits

    for target in (f16, q4):
        check = check_pair(gemma_paths[0], target)
        assert check.compatible and check.lossless, check.reason
        server = VerifierServer(target, ServerConfig(port=0, max_sessions=2, max_context=512), name=target.stem)
        server.start()
        draft = LlamaDraftModel(gemma_paths[0], name="gemma-3-270m-q4_0", n_ctx=512)
        try:
            with EdgeClient(server.address, draft=draft, generation=GenerationConfig(max_tokens=24)) as client:
                assert client.server_info().exact_numerics
                speculative = client.generate("def add(a, b):", drafting="fixed", draft_k=4).until_done()
                alone = client.generate_target_only("def add(a, b):").until_done()
            # random weights: a random text, but the target's own, by either route
            assert speculative.token_ids == alone.token_ids and len(alone.token_ids) == 24
            assert speculative.stats.rounds > 0
        finally:
            draft.close()
            server.stop()


@pytest.mark.models
@pytest.mark.timeout(600)
def test_the_random_target_served_by_the_replay_launcher_accepts_what_gemma_accepted(gpu_toy_target, tmp_path):
    """benchmarks/rigs/replayed.py with the fleet simulator (issue 51, item 2): gemma's recorded
    drafting replayed against the random target, every pass run by llama.cpp; with the replay every
    verdict is the one the real gemma target gave (the fleet's check passes), without it the random
    target's own verdicts fail that check."""
    from benchmarks.rigs.fleet_runs import draft_fingerprint, record
    from benchmarks.rigs.fleet_sim import DeviceSpec, Fleet, load_traces
    from benchmarks.rigs.verifier_process import serve_process
    from edgekit.drafting import FixedWindow

    traces, meta = load_traces(record("gemma-270m", 2, 12, 4, None, tmp_path / "traces.json"))
    f16 = gpu_toy_target[0]["path"]
    serve = ["--model", f16, "--max-sessions", "4", "--max-context", "512"]

    def fleet_on(replay: Path | None) -> Fleet:
        with serve_process(serve, tmp_path / "serve.log", replay) as served:
            specs = [DeviceSpec(None, None, speed_factor=1.0, rtt_ms=2.0) for _ in range(2)]
            return Fleet(served.address, draft_fingerprint(meta), traces, specs,
                         controller=lambda: FixedWindow(3), duration=2.0, max_window=4, min_responses=1).run()

    alone = fleet_on(None)
    assert alone.errors and "the trace says" in alone.errors[0]
    replayed = fleet_on(tmp_path / "traces.json")
    assert replayed.errors == [] and replayed.responses
    assert all(r.tokens == len(traces[0].target) or r.tokens == len(traces[1].target) for r in replayed.responses)
