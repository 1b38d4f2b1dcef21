"""benchmarks/serve_load.py in its smallest configuration, so that it does not rot between the
runs that measure at scale: 8 instant devices for 2 s against the real verifier (a toy engine
at zero cost) in a process of its own, the generator in another. Every verdict a device gets
is checked against the toy target's greedy decoding: none may differ, no call may fail."""

from __future__ import annotations

import json

import pytest

import benchmarks
from benchmarks.rigs import roofline

# the verifier's stages of a Verify call, as its statistics time them (serve_load's round_ms adds gRPC's)
VERIFY_STAGES = ("decode", "checks", "submit", "queue", "engine", "handoff", "accept", "answer")


def serve_load(*argv: str) -> None:
    """The benchmark run in this process, as `python -m benchmarks serve_load ARGV` runs it."""
    benchmarks.run("serve_load", argv)


@pytest.mark.timeout(60)
def test_the_smallest_run_measures_rounds_and_stages(tmp_path):
    serve_load("--devices", "8", "--kinds", "zero", "--duration", "2", "--warmup", "0.5", "--profile", "",
               "--results-dir", str(tmp_path), "--out", "serve_load_test", "--no-plot")
    result = json.loads((tmp_path / "serve_load_test.json").read_text())
    assert {"machine", "settings", "workload", "roofline_7b_ms", "stages", "points", "done_when"} <= result.keys()
    (point,) = result["points"]
    assert "failed" not in point, point
    assert point["kind"] == "zero" and point["devices"] == 8
    assert point["rounds_per_s"] > 0 and point["committed_tokens_per_s"] > point["rounds_per_s"]
    assert point["mismatches"] == 0 and point["errors"] == {}, (point["mismatch_examples"], point["errors"])
    assert 0 < point["acceptance"] < 1
    # the verifier counted the rounds the devices saw, and timed each stage of them
    assert point["verifier"]["rounds_per_s"] > 0
    assert 0 < point["verifier"]["engine_busy_share"] < 1
    assert set(point["round_ms"]) == {"grpc", *VERIFY_STAGES}
    assert all(point["round_ms"][s] >= 0 for s in VERIFY_STAGES)
    assert point["verifier"]["call_ms"] < point["rtt_ms"]["mean"]
    assert point["engine_step_share"]["run"] > 0
    assert point["ceiling_rounds_per_s"]["generator_cpu"] > 0 and point["loadgen"]["cpu_share"]
    shares = point["device_rounds"]  # every device's rounds, and how evenly they were served
    assert 0 < shares["jain"] <= 1 and shares["min"] <= shares["median"] <= shares["max"] > 0
    # where a device's time in the window went: its calls, one at a time, so at most the window
    waits = point["device_waits_s"]
    assert waits["Verify"] > 0 and sum(waits.values()) <= point["window_s"] * (1 + 1e-9)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("rounds", ["stream", "unary"])
def test_a_thousand_devices_on_one_verifier_see_no_error_and_only_the_targets_tokens(tmp_path, rounds):
    """1,024 devices connected at once, each with a round in flight, as a Verify call each or on a
    stream per session (`ClientConfig.round_streams`): every verdict the toy
    target's greedy one, no call failed (gRPC's core cancels calls at random once more than 1,000
    wait for the server's Python to take them, unless the verifier makes room: it did not before)."""
    serve_load("--devices", "1024", "--kinds", "zero", "--duration", "3", "--profile", "", "--rounds", rounds,
               "--results-dir", str(tmp_path), "--out", "thousand", "--no-plot")
    (point,) = json.loads((tmp_path / "thousand.json").read_text())["points"]
    assert "failed" not in point, point
    assert point["errors"] == {} and point["mismatches"] == 0, (point["error_examples"], point["mismatch_examples"])
    assert point["verifier"]["sessions_open"] >= 1000 and point["rounds_per_s"] > 0
    waits = point["device_waits_s"]  # the rounds' waits named by the way they went
    assert ("Rounds" in waits, "Verify" in waits) == ((True, False) if rounds == "stream" else (False, True))


@pytest.mark.timeout(120)
def test_front_ends_over_one_engine_answer_every_device_as_the_target_and_are_counted_together(tmp_path):
    """`--frontends 3` (`edgekit serve --frontends`): 64 devices spread by the kernel over three
    verifier processes over one engine: every verdict the toy target's, no call failed; the
    verifier's figures are the front ends' together, its batches the engine's calls (each holding
    one front end's batch or several), its CPU every process's."""
    serve_load("--devices", "64", "--kinds", "7b", "--duration", "2", "--warmup", "1", "--profile", "",
               "--frontends", "3", "--results-dir", str(tmp_path), "--out", "frontends", "--no-plot")
    (point,) = json.loads((tmp_path / "frontends.json").read_text())["points"]
    assert "failed" not in point, point
    assert point["errors"] == {} and point["mismatches"] == 0, (point["error_examples"], point["mismatch_examples"])
    v = point["verifier"]
    # (sessions open at the sample: fewer than the devices, by those between two answers)
    assert v["sessions_open"] > 0 and v["rounds_per_s"] > 0
    assert 0 < v["device_busy_share"] <= v["engine_busy_share"] < 1
    assert point["verifier_cpu_share"] > 0


@pytest.mark.timeout(90)
def test_the_modelled_device_is_busy_only_for_its_steps_within_the_engines_busy_time(tmp_path):
    """`--kinds 7b` (the device's time after the host's part of each step): the device's busy share
    counts the roofline's ms of the batches that ran, all inside the engine's own busy time (each
    step sleeps at least its device time after the toy's Python)."""
    serve_load("--devices", "8", "--kinds", "7b", "--duration", "2", "--warmup", "0.5", "--profile", "",
               "--results-dir", str(tmp_path), "--out", "device_step", "--no-plot")
    (point,) = json.loads((tmp_path / "device_step.json").read_text())["points"]
    assert "failed" not in point, point
    assert point["errors"] == {} and point["mismatches"] == 0
    v = point["verifier"]
    assert 0 < v["device_busy_share"] <= v["engine_busy_share"] < 1


def test_the_cost_model_is_the_roofline_at_its_points():
    """A batch of B sessions' blocks of 4 (5 rows each) takes the roofline's verify time for B;
    B single tokens its plain-decoding time; in between and beyond, lines through the points."""
    for b, (plain, verify) in roofline.ROOFLINE_7B.items():
        assert roofline.rows_ms(5 * b, b) == pytest.approx(verify)
        assert roofline.rows_ms(b, b) == pytest.approx(plain)
    assert roofline.rows_ms(5 * 96, 96) == pytest.approx((11.9 + 20.2) / 2)
    assert roofline.rows_ms(5 * 512, 512) > roofline.rows_ms(5 * 256, 256)


def test_the_verifier_times_every_round_by_stage():
    """In process (no gRPC): each verify call is counted once, its stages are those of a round that
    reached the engine, and the engine loop counted a step per batch with the run the statistics
    have."""
    from edgekit.testing import ToyLanguageModel, toy_client

    client = toy_client(ToyLanguageModel(seed=4), max_tokens=40, draft_k=4, stop_at_eos=False)
    for _ in client.generate("hello"):
        pass
    snap = client.transport.service.stats.snapshot()
    verify, step = snap.stages["Verify"], snap.stages["engine step"]
    rounds = sum(c.rounds for c in snap.classes.values())
    assert verify["calls"] == rounds > 0
    assert set(verify) == {"calls", "decode", "checks", "submit", "queue", "engine", "handoff", "accept", "answer"}
    assert all(v >= 0 for v in verify.values())
    assert step["calls"] == snap.batches and step["run"] == pytest.approx(snap.engine_s)
    # one session: a batch per round, and one for the prompt; the rounds' engine time is the other runs
    opened = snap.stages["OpenSession"]
    assert verify["engine"] + opened["engine"] == pytest.approx(step["run"], rel=1e-3)
    assert opened["calls"] == 1


@pytest.mark.timeout(60)
def test_a_flooding_device_is_counted_apart_from_the_devices_it_slows(tmp_path):
    """`--flood`: one abusive device keeping calls in flight beside the measured ones, its answers
    counted apart; the honest devices' figures stay theirs (issue 50, part 6: the measurement)."""
    serve_load("--devices", "4", "--kinds", "zero", "--duration", "2", "--warmup", "0.5", "--profile", "",
               "--flood", "8", "--results-dir", str(tmp_path), "--out", "flood", "--no-plot")
    (point,) = json.loads((tmp_path / "flood.json").read_text())["points"]
    assert "failed" not in point, point
    assert point["flood"]["calls_in_flight"] == 8 and point["flood"]["calls_per_s"] > 0
    assert point["mismatches"] == 0 and point["errors"] == {}, point["error_examples"]
    assert point["device_rounds"]["min"] > 0 and point["device_rounds"]["devices"] == 4  # the honest ones only


@pytest.mark.timeout(60)
def test_devices_wait_their_round_trip_and_draft_the_verifiers_budgets(tmp_path):
    """`--rtt-ms 20`: a device waits 20 ms before each call, so 2 devices make at most 100 rounds a
    second; `--budgets goodspeed --token-budget 2`: the verifier assigns 2 draft tokens over the two
    sessions, and the devices draft what they are given (every verdict still the target's)."""
    serve_load("--devices", "2", "--kinds", "zero", "--duration", "2", "--warmup", "0.5", "--profile", "",
               "--rtt-ms", "20", "--budgets", "goodspeed", "--token-budget", "2", "--k", "8",
               "--results-dir", str(tmp_path), "--out", "paced", "--no-plot")
    (point,) = json.loads((tmp_path / "paced.json").read_text())["points"]
    assert "failed" not in point, point
    assert point["mismatches"] == 0 and point["errors"] == {}, (point["mismatch_examples"], point["error_examples"])
    assert 0 < point["rounds_per_s"] <= 2 / 0.020
    drafted_per_round = point["aal"] / point["acceptance"]  # accepted per round over accepted per drafted
    assert drafted_per_round <= 2  # within the budgets (8 a round without them)
    assert point["device_tokens_per_s"]["min"] > 0
