"""Issue 51's sweep (benchmarks/gpu/goodput.py) on the CPU, as CI runs it so that it does not rot
between the rare sessions with a GPU: its arithmetic against the issue's roofline table, the
baseline's window accounting, the devices' tables from recorded traces, and the whole dry run on
a toy random target with gemma's tokenizer (every verdict and every target-only token checked
against the recorded real target)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.rigs import loadgen, roofline, streams

ROOT = Path(__file__).resolve().parents[1]
GEMMA_TRACES = ROOT / "benchmarks" / "results" / "fleet_traces_gemma-270m.json"


# The 7B shape's rows of /work/shared/gpu/roofline_h200.md (ms, rounded there to 0.1)
ROOFLINE = {32: (6.6, 6.9, 7.2, 7.9, 10.5), 64: (7.2, 7.8, 11.0, 11.9, 18.8), 128: (8.6, 11.2, 14.2, 20.2, 33.2)}


def test_the_gain_is_the_issues_roofline_table():
    """At a = 0.8 the table says 2.79x (K=4), 2.03x (K=4) and 1.47x (K=2) at 32, 64 and 128
    sequences; from the rounded step times the formula must give them within 2%."""
    rows = [{"batch": b, "tokens": t, "ms": ms}
            for b, times in ROOFLINE.items() for t, ms in zip((1, 2, 3, 5, 9), times)]
    step = roofline.curve_lookup(rows)
    for batch, gain, k in ((32, 2.79, 4), (64, 2.03, 4), (128, 1.47, 2)):
        best = roofline.best_gain(step, batch, 0.8, roofline.ROOFLINE_KS)
        assert best["k"] == k and best["gain"] == pytest.approx(gain, rel=0.02), (batch, best)
    assert step(48, 1) == pytest.approx((6.6 + 7.2) / 2)  # between measured batches: linear


def test_the_acceptance_is_found_from_the_tokens_a_round_commits():
    for a in (0.3, 0.6, 0.8, 0.95):
        for k in (1, 4, 8):
            assert roofline.acceptance_for(roofline.expected(a, k), k) == pytest.approx(a, abs=1e-6)
    assert roofline.expected(1.0, 4) == 5 and roofline.expected(0.0, 4) == 1


def test_each_completion_counts_in_the_share_of_its_time_inside_the_window():
    done = [streams.Completion(0, 0.0, 10.0, 100),   # half inside [5, 15]: 50 tokens
            streams.Completion(1, 6.0, 8.0, 20),     # all inside: 20
            streams.Completion(1, 14.0, 18.0, 40),   # a quarter inside: 10
            streams.Completion(0, 16.0, 17.0, 99)]   # after the window: none
    out = streams.summarize(done, [], 5.0, 15.0, 2)
    assert out["committed_tokens_per_s"] == pytest.approx((50 + 20 + 10) / 10)
    assert out["completions"] == 1 and out["per_stream_tokens_per_s"]["median"] == pytest.approx(10.0)


@pytest.mark.models
def test_the_devices_tables_from_traces_are_what_the_traces_say(gemma_paths):
    """Each position's block is the recorded draft's first K tokens, its accepted count the trace's,
    and no position is so near the end that the token after its block is unknown."""
    from benchmarks.rigs.fleet_sim import load_traces

    traces, meta = load_traces(GEMMA_TRACES)
    tables = loadgen.Tables(loadgen.Workload(traces=str(GEMMA_TRACES), tokenizer=str(gemma_paths[1]), k=3))
    assert tables.draft_model == meta["draft"] and tables.fingerprint.vocab_size == 262_144
    assert len(tables.prompts) == sum(len(t.target) > 3 for t in traces)
    for t, blocks, accepted in zip(traces, tables.blocks, tables.accepted):
        assert len(blocks) == len(t.target) - 3
        for i, block in enumerate(blocks):
            assert block == tuple(t.drafts[i][:3]) and accepted[i] == t.accepted(i, block)
            assert i + accepted[i] < len(t.target)  # the token after the accepted ones is recorded
    assert 0 < tables.acceptance < 1
    with pytest.raises(ValueError, match="blocks of up to 8"):
        loadgen.Tables(loadgen.Workload(traces=str(GEMMA_TRACES), tokenizer=str(gemma_paths[1]), k=9))


@pytest.mark.models
@pytest.mark.timeout(900)
def test_the_dry_run_measures_every_part_and_every_answer_is_the_recorded_targets(gpu_toy_target, tmp_path):
    target = next(m["path"] for m in gpu_toy_target if m["type"] == "f16")
    # the verifier's greedy rows reduced by llama.cpp (as a GPU run may ask), the curve both ways
    done = subprocess.run([sys.executable, "-m", "benchmarks", "gpu.goodput", "--dry-run", "--target", target,
                           "--out", str(tmp_path), "--llama-server", "", "--reduce-rows", "llama",
                           "--curve-also", "host"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "goodput.json").read_text())
    assert result["dry_run"] and result["numerics"] == "exact" and result["devices"] == [2, 4]
    assert 0 < result["acceptance"]["a"] < 1
    # the step curve: every shape measured, a median no quicker than its quickest run. Its ordering
    # (a step of 5 rows a sequence dearer than one of 1) is a timing, left to the benchmark: on a
    # loaded 2-core CI machine the toy's medians of a few runs can invert (CI saw it)
    curve = {(r["batch"], r["tokens"]): r["ms"] for r in result["step_curve"]}
    assert set(curve) == {(b, t) for b in (2, 4) for t in (1, 2, 3, 5)}  # the dry run: K = 1, 2, 4
    assert all(0 < r["ms_min"] <= r["ms"] for r in result["step_curve"])
    assert result["reduce_rows"] == "llama" and result["step_curve_also"]["reduce_rows"] == "host"
    assert {(r["batch"], r["tokens"]) for r in result["step_curve_also"]["rows"]} == set(curve)
    assert all(p["errors"] == [] and p["committed_tokens_per_s"] > 0 for p in result["baseline"]["points"])
    # every verdict and every streamed token the recorded real target's, no call failed
    assert set(result["edgekit"]) == {"centralized", "k4", "goodspeed", "wisp"}
    for system, run in result["edgekit"].items():
        for p in run["points"]:
            assert "failed" not in p, (system, p)
            assert p["mismatches"] == 0 and p["errors"] == {}, (system, p["mismatch_examples"], p["error_examples"])
            assert p["committed_tokens_per_s"] > 0
    assert {p["kind"] for p in result["edgekit"]["centralized"]["points"]} == {"instant", "replayed"}
    # GOODSPEED's C at each N: N devices x the best K of the engine's roofline there
    for n, c in result["edgekit"]["goodspeed"]["token_budget"].items():
        assert c > 0 and c % int(n) == 0, (n, c)
    for row in result["comparison"]:
        assert row["best"] in ("k4", "goodspeed", "wisp") and row["gain"] > 0
        assert row["roofline_llama_cpp"]["gain"] > 0
        assert all(v["engine_busy_share"] > 0 for v in row["edgekit"].values())
        speeds = row["edgekit"]["k4"]["device_tokens_per_s"]
        assert speeds["min"] > 0 and set(speeds["reaching"]) == {"realtime", "interactive", "standard", "relaxed"}
        # wisp's devices hold the classes in turn: 2 devices the first two, 4 one each
        held = row["edgekit"]["wisp"]["device_tokens_per_s"]["classes"]
        assert sum(c["devices"] for c in held.values()) == row["devices"]
    assert (tmp_path / "goodput.png").stat().st_size > 10_000


def test_a_gpu_engine_decodes_a_batch_the_scheduler_formed_in_one_call():
    """On a GPU a call costs a step whatever its rows (until it is compute-bound): the scheduler's
    batch of up to max_batch_rows rows (128 devices x 5 rows: 640) must not be split at 512. On a
    CPU, where splitting costs nothing and a larger call's buffers do, it stays 512."""
    from edgekit.verifier.engine import call_rows

    assert call_rows(32, 2048, offloaded=True) == 2048
    assert call_rows(32, 256, offloaded=True) == 512 and call_rows(600, 0, offloaded=True) == 601
    assert call_rows(32, 2048, offloaded=False) == 512


@pytest.mark.models
def test_the_served_engine_is_given_the_schedulers_batch_rows(gemma_server):
    from edgekit.runtime import gpu_offload

    engine = gemma_server.engine
    expected = gemma_server.config.max_batch_rows if gpu_offload() and engine.model.gpu_layers != 0 else 512
    assert engine._ctx.n_batch == expected


@pytest.mark.models
def test_fast_numerics_decode_prompts_in_the_same_call_as_the_rounds(gemma_paths):
    """A GPU pays a step per call: with fast numerics two sessions' prompts and a third's round go
    in one llama.cpp call (each session's KV then as long as its tokens); exact numerics keep each
    prompt in calls of its own, so the KV it leaves does not depend on what else ran."""
    from edgekit.verifier import Feed, LlamaEngine

    prompt = tuple(range(100, 120))
    for exact, calls_expected in ((False, 1), (True, 3)):
        engine = LlamaEngine(str(gemma_paths[1]), max_context=128, n_seq=3, max_block=8, exact=exact)
        try:
            engine.run_batch([Feed(2, 0, prompt, 0)])
            decode, calls = engine._ctx.decode, []

            def counted(*args, _decode=decode, _calls=calls):
                _calls.append(len(args[0]))
                return _decode(*args)

            engine._ctx.decode = counted
            outs = engine.run_batch([Feed(0, 0, prompt, 0), Feed(1, 0, prompt[:12], 0),
                                     Feed(2, 20, (5, 6, 7), 3, argmax=engine.n_vocab)])
            assert len(calls) == calls_expected and sum(calls) == 20 + 12 + 3, (exact, calls)
            assert [engine.cached(s) for s in range(3)] == [20, 12, 23]
            assert len(outs[2]) == 3 and len(outs[0]) == len(outs[1]) == 0
        finally:
            engine.close()


def test_the_gpus_busy_share_is_nvidia_smis_utilization_over_the_window(tmp_path, monkeypatch):
    """`harness.GpuUtilization` averages what nvidia-smi prints while the block runs (a stand-in
    prints four samples, each line as nvidia-smi's csv,noheader,nounits does, then waits to be
    stopped); without one on the PATH it says None."""
    import time

    from benchmarks import harness as C

    fake = tmp_path / "nvidia-smi"
    ready = tmp_path / "printed"
    fake.write_text(f"#!/bin/sh\necho 40\necho 60\necho 35\necho 65\ntouch {ready}\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with C.GpuUtilization() as gpu:
        deadline = time.monotonic() + 30
        while not ready.exists():  # the four samples printed: the event, not a sleep long enough
            assert time.monotonic() < deadline, "the stand-in never printed"
            time.sleep(0.01)
    assert gpu.samples == 4 and gpu.mean == pytest.approx(0.5)
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    with C.GpuUtilization() as none:
        pass
    assert none.mean is None and none.samples == 0
