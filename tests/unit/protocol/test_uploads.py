"""Hidden-state uploads on fakes: the encodings, WISV's payload formulas against
real message sizes, FH and SH rounds, the latency model and the upload choice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from edgekit import ConfigError, EdgeClient
from edgekit.errors import HiddenStateError
from edgekit.link import CostTracker, LatencyModel, Overheads, PayloadModel, varint_bits
from edgekit.protocol import (
    BlockRequest,
    LinkState,
    bits_per_element,
    decode_hidden,
    encode_hidden,
    encoding_error,
    hidden_to_pb,
    pb,
    verify_request_to_pb,
)
from edgekit.testing import (
    Call,
    FakeDraftModel,
    ScriptedTransport,
    SimulatedLink,
    ToyLanguageModel,
    toy_client,
    toy_verifier,
)

RNG = np.random.default_rng(7)


def _rows(k: int, d: int = 640) -> np.ndarray:
    return RNG.normal(0, 1.5, (k, d)).astype(np.float32)


# -- encodings ---------------------------------------------------------------------


def test_fp16_round_trip_error_is_within_half_precision():
    rows = _rows(8)
    back = decode_hidden(encode_hidden(rows, "fp16"))
    assert back.shape == rows.shape and back.dtype == np.float32
    assert np.all(np.abs(back - rows) <= np.abs(rows) * 2.0**-11 + 2.0**-24)
    err = encoding_error(rows, "fp16")
    assert err["rel_rms"] < 3e-4 and err["min_cosine"] > 0.99999


def test_int8_error_is_at_most_half_a_step_per_row():
    rows = _rows(8)
    enc = encode_hidden(rows, "int8")
    back = decode_hidden(enc)
    steps = np.abs(rows).max(axis=1) / 127
    assert np.all(np.abs(back - rows) <= steps[:, None] / 2 + 1e-6)
    assert enc.nbytes == 8 * 640 + 8 * 4  # a byte per element, a float32 scale per row
    err = encoding_error(rows, "int8")
    assert 1e-3 < err["rel_rms"] < 2e-2 and err["min_cosine"] > 0.999


def test_bits_per_element_are_those_of_eq_3():
    assert bits_per_element("fp16", 640) == 16
    assert bits_per_element("int8", 640) == 8 + 32 / 640
    with pytest.raises(HiddenStateError, match="unknown"):
        bits_per_element("fp8", 640)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(dim=320), "320 wide; the session's draft model has 640"),
        (dict(count=3), "3 hidden-state rows sent; the round needs 4"),
        (dict(positions=(0, 1, 3, 2)), "block offsets \\[0, 1, 3, 2\\]"),
        (dict(data=b"\x00" * 10), "10 bytes; 4 rows of 640 need 5120"),
        (dict(encoding="fp8"), "encoding 'fp8' is not supported"),
    ],
)
def test_decoding_refuses_what_does_not_fit_the_round(change, message):
    enc = replace(encode_hidden(_rows(4), "fp16"), **change)
    with pytest.raises(HiddenStateError, match=message):
        decode_hidden(enc, dim=640, positions=range(4))


def test_int8_scales_and_non_finite_values_are_refused():
    enc = encode_hidden(_rows(2), "int8")
    with pytest.raises(HiddenStateError, match="one scale per row"):
        decode_hidden(replace(enc, scales=enc.scales[:1]))
    with pytest.raises(HiddenStateError, match="finite and positive"):
        decode_hidden(replace(enc, scales=(1.0, -1.0)))
    nan = np.frombuffer(np.full(640, np.nan, dtype="<f2").tobytes() * 2, dtype=np.uint8).tobytes()
    with pytest.raises(HiddenStateError, match="NaN"):
        decode_hidden(replace(encode_hidden(_rows(2), "fp16"), data=nan))
    with pytest.raises(HiddenStateError, match="does not fit fp16"):
        encode_hidden(np.full((1, 4), 1e6, np.float32), "fp16")


# -- payload sizes: WISV eqs. 3-9 against the messages we send ------------------------


def _request(k: int, upload: str, encoding: str = "fp16", tokens=None) -> pb.VerifyRequest:
    tokens = tokens if tokens is not None else [int(t) for t in RNG.integers(0, 262144, k)]
    block = BlockRequest(
        session_id="s-" + "a" * 22,
        base_position=1000,
        draft_tokens=tokens,
        link=LinkState(12.5, 1.25, 87.5, 250.0, 0.01, 40),
        round_index=77,
        upload=upload,
        hidden=_rows(k),
        hidden_encoding=encoding,
    )
    return verify_request_to_pb(block)


@pytest.mark.parametrize("encoding", ["fp16", "int8"])
@pytest.mark.parametrize("k", [1, 4, 8, 16])
def test_measured_upload_sizes_match_eqs_3_to_9(k, encoding):
    """Each message's size is the formula's, with O_ul measured once on an empty
    message, up to protobuf's length prefixes (a few bytes that grow with size)."""
    pm = PayloadModel.for_models(640, 262144, encoding, Overheads(uplink_bits=0, downlink_bits=0))
    tokens = [int(t) for t in RNG.integers(0, 262144, k)]
    token_bits = sum(varint_bits(t) for t in tokens)
    assert token_bits <= k * pm.token_bits  # b_tok = 24 bounds every id of a 262k vocabulary
    o_ul = 8 * _request(0, "tokens", tokens=[]).ByteSize()
    # field tags and length prefixes: packed ids (2 bytes), the hidden message (3), its
    # encoding, count and width (7), data (3), int8 scales (2): 17 bytes at most here
    framing = 8 * 17

    fh = 8 * _request(k, "fh", encoding, tokens).ByteSize()  # eq. (5)
    formula = token_bits + k * pm.hidden_row() + o_ul
    assert formula <= fh <= formula + framing

    sh1 = 8 * _request(k, "sh", encoding, tokens).ByteSize()  # eq. (7)
    assert token_bits + o_ul <= sh1 <= token_bits + o_ul + framing

    m = max(1, k // 2)
    positions = tuple(range(0, 2 * m, 2))[:m]
    second = _request(k, "sh", encoding, tokens)
    second.hidden.CopyFrom(hidden_to_pb(encode_hidden(_rows(m), encoding, positions)))
    sh2 = 8 * second.ByteSize() - sh1  # eq. (9): what the second upload adds to the first
    assert m * pm.hidden_row() <= sh2 <= m * pm.hidden_row() + m * pm.position_bits + framing

    ask = pb.VerifyResponse(hidden_request=pb.HiddenRequest(positions=positions, encoding=1))
    assert 8 * ask.ByteSize() - m * pm.position_bits <= 8 * 8  # eq. (8): m offsets plus a few bytes


def test_feedback_is_a_position_a_token_and_overhead():
    pm = PayloadModel.for_models(640, 262144)
    verdict = pb.VerifyResponse(verdict=pb.Verdict(accepted=5, next_token=262143, committed_length=1006))
    body = 8 * verdict.ByteSize()
    assert pm.position_bits + pm.token_bits <= body <= pm.feedback()  # eq. (4), O_dl covers the rest


# -- rounds through the fake verifier -------------------------------------------------


def _client(
    upload: str, *, link: SimulatedLink | None = None, seed: int = 5, noise: float = 2.0,
    handler: Callable[[Call], Any] | None = None, **gen
) -> tuple[EdgeClient, ScriptedTransport]:
    """A client uploading as `upload`; `handler` sees its calls to the verifier (a `ScriptedTransport`'s)."""
    verifier = ScriptedTransport(toy_verifier(ToyLanguageModel(seed=seed), link=link), handler=handler)
    draft = FakeDraftModel(ToyLanguageModel(seed=seed, noise=noise), n_embd=640)
    gen = dict(max_tokens=60, stop_at_eos=False, drafting="fixed", draft_k=6, upload=upload) | gen
    return toy_client(draft=draft, verifier=verifier, **gen), verifier


def _run(client: EdgeClient):
    return client.generate("uploads").until_done()


def test_fh_uploads_every_row_and_sh_only_the_mismatches_with_the_same_output():
    runs = {u: _run(_client(u)[0]) for u in ("tokens", "fh", "sh")}
    assert runs["fh"].token_ids == runs["tokens"].token_ids == runs["sh"].token_ids
    fh, sh = runs["fh"].stats, runs["sh"].stats
    assert fh.server.hidden_rows == fh.drafted and fh.exchanges == fh.rounds
    assert runs["tokens"].stats.server.hidden_rows == 0
    rejected = sum(r.accepted < r.drafted for r in sh.rounds_detail)
    assert 0 < rejected < sh.rounds
    assert sh.exchanges == sh.rounds + rejected  # a second exchange exactly when there was a mismatch
    assert 0 < sh.server.hidden_rows < sh.drafted
    assert sh.uplink_bytes < fh.uplink_bytes
    for r in sh.rounds_detail:
        assert (r.exchanges == 2) == (r.accepted < r.drafted) and r.server.hidden_rows >= (r.accepted < r.drafted)


def test_sh_asks_for_the_mismatch_positions():
    answers = []

    def recording(call: Call) -> Any:
        if call.method != "verify":
            return call.forward()
        block = call.arguments["block"]
        context = list(call.transport.inner.service.sessions.get(block.session_id).tokens)
        result = call.forward()
        answers.append((block, context, result))
        return result

    client, verifier = _client("sh", handler=recording)
    _run(client)
    asked = 0
    for block, context, result in answers:
        assert block.upload == "sh" and block.hidden.shape == (len(block.draft_tokens), 640)
        # every offset whose draft token is not the target's own choice there, and no other
        draft = list(block.draft_tokens)
        expected = [i for i, t in enumerate(draft)
                    if int(np.argmax(verifier.inner.service.engine.lm.logits(context + draft[:i]))) != t]
        assert list(result.hidden_requested) == expected
        asked += len(expected)
    assert asked > 0


def test_an_upload_the_verifier_cannot_take_is_refused_not_downgraded():
    def tokens_only(call: Call) -> Any:
        answer = call.forward()
        return replace(answer, upload_protocols=("tokens",)) if call.method == "handshake" else answer

    client, _ = _client("fh", handler=tokens_only)
    with pytest.raises(ConfigError, match="needs FH uploads, which the verifier at in-process does not take"):
        _run(client)


def test_the_rtt_rule_and_the_latency_model_choose_by_the_link():
    slow_near = SimulatedLink(rtt_ms=2.0, uplink_mbps=5.0, downlink_mbps=50.0, seed=1)
    fast_far = SimulatedLink(rtt_ms=60.0, uplink_mbps=500.0, downlink_mbps=500.0, seed=1)
    for link, rule, model in ((slow_near, "sh", "sh"), (fast_far, "fh", "fh")):
        for upload, expected in (("rtt", rule), ("auto", model)):
            client, _ = _client(upload, link=link)
            client.probe_link(pings=5, tries=2, payload_bytes=64 * 1024)
            rounds = _run(client).stats.rounds_detail
            full = {r.upload for r in rounds if r.drafted == 6}  # a short last block may tip the other way
            assert full == {expected}, (link.rtt_ms, upload, full)


def test_auto_measures_the_rates_it_needs_before_the_first_round():
    link = SimulatedLink(rtt_ms=3.0, uplink_mbps=4.0, downlink_mbps=40.0, seed=6)
    client, _verifier = _client("auto", link=link)
    rounds = _run(client).stats.rounds_detail
    assert client.link.uplink_mbps == pytest.approx(4.0, rel=0.15)
    assert rounds[0].upload == "sh"  # a slow uplink, known before the first block went out


def test_the_link_keeps_current_from_both_exchanges_of_sh_rounds():
    link = SimulatedLink(rtt_ms=30.0, uplink_mbps=100.0, downlink_mbps=100.0, seed=2)
    client, _ = _client("sh", link=link)
    stats = _run(client).stats
    assert client.link.samples == stats.exchanges  # no probe: SH needs no rates
    assert client.link.state().rtt_ms == pytest.approx(30.0, rel=0.05)


# -- the latency model ------------------------------------------------------------------


def _model(
    rtt: float, up: float, *, p: float = 0.7, verify=(20.0, 2.0), step: float = 8.0, loss: float = 0.0
) -> LatencyModel:
    costs = CostTracker(draft_step_ms=step, verify_ms=verify, acceptance=p)
    link = LinkState(rtt_ms=rtt, uplink_mbps=up, downlink_mbps=up * 4, loss_rate=loss)
    return LatencyModel(PayloadModel.for_models(640, 262144), link, costs)


def test_fh_costs_its_payload_and_sh_an_expected_extra_round_trip():
    m = _model(50.0, 20.0)
    pm = m.payload
    k = 6
    assert m.comm_ms(k, "fh") - m.comm_ms(k, "tokens") == pytest.approx(k * pm.hidden_row() / 20e3)
    p_some, mean_m = m.expected_mismatches(k)
    assert p_some == pytest.approx(1 - 0.7**k)
    assert 1 <= mean_m <= k
    extra = m.comm_ms(k, "sh") - m.comm_ms(k, "tokens")
    second = pm.sh_request(mean_m) / 80e3 + pm.sh_hidden_uplink(mean_m) / 20e3 + 50.0
    assert extra == pytest.approx(p_some * second)


@pytest.mark.parametrize(
    "rtt, rate, expected",
    [(50.0, 500.0, "fh"), (50.0, 20.0, "fh"), (5.0, 500.0, "fh"), (2.0, 5.0, "sh"), (5.0, 4.0, "sh")],
)
def test_the_choice_follows_the_regimes_of_wisv(rtt, rate, expected):
    # WISV VII: SH for low rate and low RTT, FH for high rate or high RTT
    assert _model(rtt, rate).choose_upload(8) == expected


def test_loss_makes_the_extra_exchange_of_sh_dearer():
    k = 8
    clean, lossy = _model(3.0, 5.0), _model(3.0, 5.0, loss=0.05)
    assert clean.choose_upload(k) == "sh" and lossy.choose_upload(k) == "fh"


def test_time_per_token_is_u_shaped_in_the_window():
    m = _model(50.0, 100.0, p=0.8)
    per = [m.per_token_ms(k, "fh") for k in range(1, 17)]
    best = int(np.argmin(per))
    assert 0 < best < 15  # neither the shortest nor the longest window
    assert all(per[i] > per[i + 1] for i in range(best)) and all(per[i] < per[i + 1] for i in range(best, 15))
    plan = m.plan(16, ("fh", "sh"))
    assert plan.window == best + 1
    # a longer round trip makes longer windows pay
    assert _model(200.0, 100.0, p=0.8).plan(16).window > _model(5.0, 100.0, p=0.8).plan(16).window


def test_cost_tracker_learns_the_verify_line_and_the_acceptance():
    t = CostTracker(decay=0.99, prior_rounds=1.0)
    rng = np.random.default_rng(0)
    for _ in range(400):
        k = int(rng.integers(1, 9))
        accepted = int(min(rng.geometric(1 - 0.6) - 1, k))
        t.observe(drafted=k, accepted=accepted, draft_ms=7.0 * k, draft_steps=k, verify_ms=12.0 + 3.0 * (k + 1))
    a, b = t.verify_line()
    assert a == pytest.approx(12.0, abs=0.5) and b == pytest.approx(3.0, abs=0.1)
    assert t.draft_step_ms == pytest.approx(7.0, rel=1e-3)  # the 10 ms prior has faded
    assert t.acceptance == pytest.approx(0.6, abs=0.06)


def test_latency_window_drafts_what_the_model_picks():
    link = SimulatedLink(rtt_ms=80.0, uplink_mbps=100.0, downlink_mbps=100.0, seed=4)
    client, _ = _client("auto", link=link, noise=0.5, drafting="latency", max_window=12)
    client.probe_link(pings=5, tries=2, payload_bytes=64 * 1024)
    result = _run(client)
    assert result.stats.drafting == "latency"
    far = np.median([r.drafted for r in result.stats.rounds_detail])
    assert far >= 6  # a long round trip, cheap drafting: long windows (the priors' first rounds aside)
    near, _ = _client("auto", link=SimulatedLink(rtt_ms=0.5, seed=4), noise=0.5, drafting="latency", max_window=12)
    near.probe_link(pings=5, tries=1, payload_bytes=1024)
    assert np.median([r.drafted for r in _run(near).stats.rounds_detail]) < far
