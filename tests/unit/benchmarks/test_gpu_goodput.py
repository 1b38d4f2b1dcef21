"""Issue 51's sweep (benchmarks/gpu/goodput.py) on the CPU, as CI runs it so that it does not rot
between the rare sessions with a GPU: its arithmetic against the issue's roofline table, the
baseline's window accounting, the devices' tables from recorded traces, and the whole dry run on
a toy random target with gemma's tokenizer (every verdict and every target-only token checked
against the recorded real target)."""

from __future__ import annotations

import pytest

from benchmarks.rigs import roofline, streams

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


def test_a_gpu_engine_decodes_a_batch_the_scheduler_formed_in_one_call():
    """On a GPU a call costs a step whatever its rows (until it is compute-bound): the scheduler's
    batch of up to max_batch_rows rows (128 devices x 5 rows: 640) must not be split at 512. On a
    CPU, where splitting costs nothing and a larger call's buffers do, it stays 512."""
    from edgekit.verifier.engine import call_rows

    assert call_rows(32, 2048, offloaded=True) == 2048
    assert call_rows(32, 256, offloaded=True) == 512 and call_rows(600, 0, offloaded=True) == 601
    assert call_rows(32, 2048, offloaded=False) == 512


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
