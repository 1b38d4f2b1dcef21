"""The fleet simulator (benchmarks/rigs/fleet_sim.py, fleet_runs.py): recorded traces
replayed by simulated devices against a real gRPC verifier. Over the toy target it
runs in seconds and its faithfulness check is shown to bite; `fleet.py smoke` runs
the short real configuration on the gemma pair, as CI does."""

from __future__ import annotations

import pytest

from benchmarks.rigs.fleet_sim import DeviceSpec, Fleet, Trace, load_traces, record_trace, save_traces
from edgekit import ServerConfig
from edgekit.drafting import FixedWindow
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server
from edgekit.verifier import ToyEngine, VerifierServer

TARGET = ToyLanguageModel(seed=11)
DRAFT = FakeDraftModel(ToyLanguageModel(seed=11, noise=1.5), n_embd=8)



@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    out = []
    for text in ("the first prompt", "a second, longer prompt for the toy"):
        prompt = DRAFT.tokenize(text)
        out.append(record_trace(DRAFT, prompt, TARGET.greedy(prompt, 24), window=6))
    return out


@pytest.fixture()
def server():
    with toy_server(TARGET, max_sessions=8, max_context=256, max_block=8, calibrate="off") as s:
        yield s


def _specs(n: int) -> list[DeviceSpec]:
    classes = [("realtime", 8.0), ("relaxed", 2.0), (None, None)]
    return [DeviceSpec(*classes[i % 3], speed_factor=1.0, rtt_ms=2.0) for i in range(n)]


def test_a_trace_holds_the_drafts_continuation_at_every_position(traces, tmp_path):
    t = traces[0]
    assert len(t.drafts) == len(t.target) == 24 and all(len(c) == 6 for c in t.drafts)
    # The draft's greedy continuation after prompt + target[:i] is what the draft proposes there.
    for i in (0, 7, 23):
        DRAFT.truncate(0)
        assert DRAFT.eval(t.prompt + t.target[:i]).stats.argmax() == t.drafts[i][0]
    assert t.accepted(0, t.target[:3] + [t.target[3] + 1]) == 3
    save_traces(tmp_path / "t.json", traces, {"pair": "toy"})
    back, meta = load_traces(tmp_path / "t.json")
    assert back == traces and meta == {"pair": "toy"}


@pytest.mark.parametrize("mode", ["speculative", "reprefill", "centralized"])
def test_devices_replay_the_traces_faithfully_in_every_mode(traces, server, mode):
    fleet = Fleet(server.address, DRAFT.fingerprint(), traces, _specs(3), mode=mode,
                  controller=lambda: FixedWindow(3), duration=1.5, max_window=6, min_responses=1).run()
    assert fleet.errors == []
    assert fleet.responses and all(r.tokens == 24 for r in fleet.responses)  # every response to the end
    summary = fleet.summary()
    assert set(summary["classes"]) == {"realtime", "relaxed", "best-effort"}
    assert summary["goodput_tokens_per_s"] > 0
    if mode != "centralized":
        assert all(r.drafted <= 3 for r in fleet.rounds)
        with_slo = [r for r in fleet.rounds if r.device % 3 != 2]
        assert with_slo and all(r.budget_ms is not None for r in with_slo)


def test_a_trace_that_is_not_the_targets_output_is_caught(traces, server):
    bad = Trace(traces[0].prompt, list(traces[0].target), [list(c) for c in traces[0].drafts],
                traces[0].features, traces[0].step_ms)
    bad.target[5] = (bad.target[5] + 1) % TARGET.vocab_size  # the recorded output is wrong from position 5
    fleet = Fleet(server.address, DRAFT.fingerprint(), [bad], _specs(1), controller=lambda: FixedWindow(3),
                  duration=0.5, max_window=6, min_responses=1).run()
    assert fleet.errors and "the trace says" in fleet.errors[0]


@pytest.mark.parametrize("mode", ["speculative", "centralized"])
def test_a_divergence_ends_the_response_when_asked_and_the_device_goes_on(traces, server, mode):
    """on_divergence="end" (a GPU verifier in fast numerics): the response stops where the verifier
    left the trace, its committed tokens counted, and the device starts its next response."""
    bad = Trace(traces[0].prompt, list(traces[0].target), [list(c) for c in traces[0].drafts],
                traces[0].features, traces[0].step_ms)
    bad.target[5] = (bad.target[5] + 1) % TARGET.vocab_size
    fleet = Fleet(server.address, DRAFT.fingerprint(), [bad], _specs(1), mode=mode,
                  controller=lambda: FixedWindow(3), duration=0.5, max_window=6, min_responses=2,
                  on_divergence="end").run()
    assert fleet.errors == []
    assert fleet.divergences == len(fleet.responses) >= 2  # every response met it, and the device went on
    if mode == "speculative":  # the verifier's tokens up to the divergence and the one it sent instead
        assert all(6 <= r.tokens <= 5 + 6 for r in fleet.responses)
    assert fleet.summary()["divergences"] == fleet.divergences


def test_sixty_four_sessions_at_once_are_all_served_faithfully_and_all_closed(traces):
    """The load run's short form (benchmarks/load.py runs 64 devices against the gemma verifier for
    10 minutes): 64 devices, each a session at a time, against one verifier over gRPC."""
    n = 64
    with toy_server(TARGET, max_sessions=n, max_context=256, max_block=8, calibrate="off") as server:
        specs = [DeviceSpec(None, None, speed_factor=1.0, rtt_ms=1.0) for _ in range(n)]
        fleet = Fleet(server.address, DRAFT.fingerprint(), traces, specs, controller=lambda: FixedWindow(3),
                      duration=4.0, max_window=6, timeout=60.0, min_responses=1).run()
        assert fleet.errors == []
        assert {r.device for r in fleet.responses} == set(range(n))  # every device finished responses
        assert all(r.tokens == 24 for r in fleet.responses)  # each to the end, every verdict as the target's
        assert len(server.service.sessions) == 0  # every session was closed
        latencies = sorted(r.round_trip_ms for r in fleet.rounds)
        assert 0 < latencies[len(latencies) // 2] <= latencies[int(len(latencies) * 0.99)]


def test_devices_draft_within_the_budgets_the_verifier_assigns(traces):
    with toy_server(TARGET, max_sessions=8, max_context=256, max_block=6, calibrate="off", budgets="goodspeed",
                    token_budget=7) as server:
        fleet = Fleet(server.address, DRAFT.fingerprint(), traces, _specs(3), controller=lambda: FixedWindow(6),
                      duration=2.0, max_window=6, min_responses=1).run()
        assert fleet.errors == [] and fleet.responses
        assert all(r.drafted <= 6 for r in fleet.rounds)
        # Three devices share C = 7 (a device between responses has no session, and the others then
        # share it: up to 6 each, the max block), so blocks are short on average while all three run:
        # from the last device's first response to the first device's last one (when a device starts,
        # and when the others stop, is up to the machine; before and after, fewer share C).
        begun = max(min(r.started for r in fleet.responses if r.device == d) for d in range(3))
        ended = min(max(r.started + r.seconds for r in fleet.responses if r.device == d) for d in range(3))
        together = [r for r in fleet.rounds if begun <= r.t <= ended]
        assert together, "the three devices never ran at once"
        assert sum(r.drafted for r in together) / len(together) <= 4.5
        assert server.service.budgets.last_capacity == 7
    from benchmarks.rigs.fleet_runs import goodspeed_figures  # the goodspeed benchmark's figures, on this run

    figures = goodspeed_figures(fleet, 3, rounds=600, beta=0.5)
    assert 0 < figures["jain"] <= 1 and figures["goodput_tokens_per_s"] > 0
    assert len(figures["utility"]) == figures["horizon"] == min(figures["rounds_per_device"].values())
    assert figures["time_split_ms"]["receiving"] > figures["time_split_ms"]["sending"] > 0


def test_the_gpu_simulation_holds_devices_to_the_budgets_its_verifier_assigns():
    from benchmarks.rigs import event_sim
    from benchmarks.rigs.fleet_runs import controller_factory, traces_path

    traces, meta = load_traces(traces_path("gemma-270m", 128))
    args = event_sim.settings(["--horizon", "20", "--warmup", "0", "--token-budget", "10"])
    args.window = meta["window"]
    code, other = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9, 10, 11)
    factory = controller_factory("budget", "gemma-270m", args.window, 4)
    sim = event_sim.Simulation("goodspeed", 4, traces, args, factory, pools=[(code, other), (other, code)],
                             switch_s=10.0, log_rounds=True).run()
    assert sim.budgets is not None and sim.budgets.last_capacity == 10
    assert sum(st.budget for st in sim.budgets.states().values()) <= 10
    assert sim.log and all(1 <= r.drafted <= args.window for r in sim.log)
    assert sum(r.drafted for r in sim.log) / len(sim.log) <= 10 / 4 + 0.5  # four share C = 10
    assert {d.trace is not None and traces.index(d.trace) in other for d in sim.devices[::2]} == {True}  # switched
    free = event_sim.Simulation("fcfs", 4, traces, args, lambda: FixedWindow(args.window), log_rounds=True).run()
    assert free.budgets is None and max(r.drafted for r in free.log or []) == args.window


def test_a_replayed_target_runs_its_own_passes_and_accepts_what_the_recorded_target_did(traces):
    """rigs/replayed.py (issue 51): a target of other weights (here another toy, on the GPU a random
    one) answers each greedy row with the traces' target token: the fleet's faithfulness check,
    which fails on the other target alone, passes, and every row it ran was answered from a trace."""
    from benchmarks.rigs.replayed import Replay

    other = ToyLanguageModel(seed=12)

    class Replayed(ToyEngine):
        def run_batch(self, feeds):
            return [self.replay(f, o) for f, o in zip(feeds, super().run_batch(feeds), strict=True)]

    def fleet_on(engine: ToyEngine):
        config = ServerConfig(port=0, max_sessions=4, max_context=256, max_block=8, calibrate="off")
        with VerifierServer(engine, config) as s:
            return Fleet(s.address, DRAFT.fingerprint(), traces, _specs(2), controller=lambda: FixedWindow(3),
                         duration=1.0, max_window=6, min_responses=1).run()

    alone = fleet_on(ToyEngine(other, n_seq=4, max_context=256))
    assert alone.errors and "the trace says" in alone.errors[0]  # the other target's own verdicts
    engine = Replayed(other, n_seq=4, max_context=256)
    engine.replay = Replay(traces)
    fleet = fleet_on(engine)
    assert fleet.errors == [] and fleet.responses and all(r.tokens == 24 for r in fleet.responses)
    replay = engine.replay
    assert replay.untraced == 0 and replay.replayed > 10 * replay.beyond  # rows past a trace: its last rounds'
    assert replay.replayed + replay.beyond == replay.rows
