"""Semantic verification (WISV): the acceptance rule, the verifier's decisions, the client's
mode and every refusal, over a toy engine and small ONNX heads built here."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edgekit import ConfigError, GenerationConfig, ProtocolError, SemanticHeadError
from edgekit.protocol import LinkState, OpenRequest, accept_semantic, mismatch_positions
from edgekit.semantic.head import GOOD_LINK, POOR_LINK, link_only_head
from edgekit.testing import FakeDraftModel, SimulatedLink, ToyLanguageModel, toy_client, toy_verifier
from edgekit.verifier import CSI_FEATURES, SemanticHead, channel_quality, csi_features
from edgekit.verifier._semantic import SemanticMode

D_DRAFT, D_TARGET = 16, 8  # the fake draft's and the toy engine's hidden sizes


def _quality_head(path, *, d_draft: int = D_DRAFT, d_target: int = D_TARGET, **kw) -> SemanticHead:
    """A head whose P(reject) is sigmoid(10 q - 5): strict on good links, lenient on poor ones."""
    return link_only_head(path, draft_hidden=d_draft, target_hidden=d_target, pair="toy", **kw)


def _client(head, link: SimulatedLink | None = None, *, n_embd: int = D_DRAFT, **gen):
    """A client of the toy verifier with this semantic head, its draft's hidden states `n_embd` wide."""
    verifier = toy_verifier(ToyLanguageModel(seed=5), link=link, semantic_head=head)
    draft = FakeDraftModel(ToyLanguageModel(seed=5, noise=2.0), n_embd=n_embd)
    gen = dict(max_tokens=60, stop_at_eos=False, drafting="fixed", draft_k=6) | gen
    return toy_client(draft=draft, verifier=verifier, **gen), verifier


# -- the rule ------------------------------------------------------------------------------


def _logits(best: list[int], vocab: int = 10) -> np.ndarray:
    out = np.zeros((len(best), vocab), dtype=np.float32)
    out[np.arange(len(best)), best] = 1.0
    return out


def test_the_first_mismatch_the_head_rejects_ends_the_block():
    logits = _logits([1, 2, 3, 4, 5])  # the target's choices at offsets 0..4 (4: after the block)
    block = [1, 9, 3, 9]  # mismatches at offsets 1 and 3
    assert mismatch_positions(logits, block) == [1, 3]
    best = [1, 2, 3, 4, 5]
    assert accept_semantic(best, block, [0.9, 0.9], 0.5) == (1, 2, 0)  # rejected at 1: the target's 2
    assert accept_semantic(best, block, [0.2, 0.9], 0.5) == (3, 4, 1)  # 1 accepted, 3 rejected
    assert accept_semantic(best, block, [0.2, 0.2], 0.5) == (4, 5, 2)  # all accepted: the bonus token
    # eq. 27 rejects when P > threshold: 0 rejects every mismatch with P > 0, 1 none
    assert accept_semantic(best, block, [0.3, 0.3], 0.0)[0] == 1
    assert accept_semantic(best, block, [1.0, 1.0], 1.0)[0] == 4
    with pytest.raises(ValueError, match="2 mismatches"):
        accept_semantic(best, block, [0.1], 0.5)


class _RecordingHead:
    identity, threshold, draft_hidden, target_hidden = "rec:0", 0.5, 3, 2

    def __init__(self, p: list[float]) -> None:
        self.p = p
        self.seen: list = []

    def check_pair(self, draft_hidden: int, target_hidden: int) -> None:
        pass

    def p_reject(self, h_draft, h_target, link, logits=None, draft_tokens=None):
        self.seen.append((h_draft.copy(), h_target.copy(), link))
        return np.asarray(self.p)


def test_the_head_reads_the_rows_of_the_mismatches_fh_and_sh():
    logits = _logits([1, 2, 3, 4, 5])
    block = [1, 9, 3, 9]
    target = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)
    link = LinkState(rtt_ms=50, uplink_mbps=20, samples=3)
    head = _RecordingHead([0.1, 0.9])
    mode = SemanticMode(head, target_hidden=2)
    fh = (tuple(range(4)), np.arange(4 * 3, dtype=np.float32).reshape(4, 3))
    assert mode.decide(logits, block, fh, target, 0.5, link) == (3, 4, 1)
    h_d, h_t, seen_link = head.seen[-1]
    assert h_d.tolist() == [fh[1][1].tolist(), fh[1][3].tolist()] and h_t.tolist() == [target[1].tolist(),
                                                                                         target[3].tolist()]
    assert seen_link is link
    sh = ((1, 3), fh[1][[1, 3]])
    assert mode.decide(logits, block, sh, target, 0.5, link) == (3, 4, 1)
    assert head.seen[-1][0].tolist() == h_d.tolist()
    with pytest.raises(ProtocolError, match=r"offsets \[3\]"):
        mode.decide(logits, block, ((1,), fh[1][[1]]), target, 0.5, link)
    with pytest.raises(ProtocolError, match="upload them"):
        mode.decide(logits, block, None, target, 0.5, link)
    # no mismatch: no head call, greedy's verdict
    n = len(head.seen)
    assert mode.decide(logits, [1, 2, 3, 4], None, None, 0.5, link) == (4, 5, 0) and len(head.seen) == n


# -- the target's confidence ---------------------------------------------------------------------


def test_target_features_read_the_targets_distribution_at_the_mismatch():
    from edgekit.verifier import TARGET_FEATURES, target_features

    uniform = np.zeros(8)
    peaked = np.array([10.0, 0, 0, 0, 0, 0, 0, -1e4])
    f = target_features(np.stack([uniform, peaked]), [3, 7])
    assert f.shape == (2, len(TARGET_FEATURES)) and f.dtype == np.float32
    assert f[0].tolist() == pytest.approx([np.log(8), -np.log(8), -np.log(8), 0.0], abs=1e-6)  # a tie: no margin
    assert f[1, 0] < 0.01 and f[1, 1] == pytest.approx(0.0, abs=1e-3)  # sure of its own token
    assert f[1, 2] == -30.0 and f[1, 3] == pytest.approx(30.0, abs=1e-3)  # the draft's, floored
    assert target_features(np.zeros((0, 8)), []).shape == (0, 4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        target_features(np.stack([uniform]), [8])
    with pytest.raises(ValueError, match="2 draft tokens"):
        target_features(np.stack([uniform]), [1, 2])


def _margin_head(path, *, slope: float = 4.0, bias: float = -6.0) -> SemanticHead:
    """A head that reads only the target's margin: P(reject) = sigmoid(slope * margin + bias),
    accepting near-ties and rejecting mismatches where the target was sure."""
    from edgekit.predictors.train import Mlp
    from edgekit.semantic.head import export_head

    width = D_DRAFT + D_TARGET + 4 + len(CSI_FEATURES)
    w0 = np.zeros((width, 2))
    w0[D_DRAFT + D_TARGET + 3, 0] = slope  # target_margin
    model = Mlp(np.zeros(width), np.ones(width), [w0, np.array([[1.0], [bias]])], [np.array([0.0, 1.0]),
                                                                                   np.zeros(1)])
    export_head(model, path, draft_hidden=D_DRAFT, target_hidden=D_TARGET, csi=True, target_features=True,
                threshold=0.5)
    return SemanticHead(path)


def test_a_head_with_target_features_decides_on_the_targets_margin(tmp_path):
    head = _margin_head(tmp_path / "margin.onnx")
    assert head.uses_target_features and head.width == D_DRAFT + D_TARGET + 4 + len(CSI_FEATURES)
    # the target's rows: offset 1 a near-tie between its 2 and the draft's 9, offset 3 a sure 4
    logits = np.zeros((5, 10), dtype=np.float32)
    logits[0, 1] = logits[2, 3] = logits[4, 5] = 5.0
    logits[1, 2], logits[1, 9] = 5.0, 4.9
    logits[3, 4] = 12.0
    block = [1, 9, 3, 9]
    mode = SemanticMode(head, target_hidden=D_TARGET)
    fh = (tuple(range(4)), np.zeros((4, D_DRAFT), dtype=np.float32))
    target = np.zeros((5, D_TARGET), dtype=np.float32)
    assert mode.decide(logits, block, fh, target, 0.5, GOOD_LINK) == (3, 4, 1)  # the tie accepted, the sure one not
    with pytest.raises(SemanticHeadError, match="reads the target's confidence"):
        head.p_reject(np.zeros((1, D_DRAFT)), np.zeros((1, D_TARGET)), GOOD_LINK)
    with pytest.raises(SemanticHeadError, match="outside the vocabulary"):
        head.p_reject(np.zeros((1, D_DRAFT)), np.zeros((1, D_TARGET)), GOOD_LINK, logits[:1], np.array([10]))


def test_a_head_naming_target_features_edgekit_does_not_compute_is_refused(tmp_path):
    import onnx

    path = tmp_path / "odd.onnx"
    _margin_head(path)
    model = onnx.load(path)
    for prop in model.metadata_props:
        if prop.key == "edgekit.target_features":
            prop.value = "target_entropy,target_rank"
    onnx.save(model, path)
    with pytest.raises(SemanticHeadError, match="target_rank"):
        SemanticHead(path)


# -- CSI -------------------------------------------------------------------------------------


def test_channel_quality_orders_links_and_an_unmeasured_link_reads_as_free():
    q_good, q_poor = channel_quality(GOOD_LINK), channel_quality(POOR_LINK)
    assert 0.85 < q_good < 1.0 and 0.2 < q_poor < 0.45
    assert channel_quality(replace(POOR_LINK, loss_rate=0.05)) < q_poor
    assert channel_quality(replace(GOOD_LINK, uplink_mbps=2.0)) < q_good  # a slow uplink costs serialisation
    assert channel_quality(LinkState()) == 1.0 and csi_features(LinkState())[0] == 1.0
    f = csi_features(POOR_LINK)
    assert f.shape == (len(CSI_FEATURES),) and f[0] == pytest.approx(q_poor) and f[2] == pytest.approx(0.5)


# -- the mode end to end over a toy verifier ---------------------------------------------------


@pytest.fixture
def head(tmp_path):
    return _quality_head(tmp_path / "head.onnx")


def test_semantic_mode_is_strict_on_a_good_link_and_lenient_on_a_poor_one(head):
    greedy = _client(None, upload="fh")[0].generate("semantic").until_done()
    runs = {}
    for name, link in (("good", SimulatedLink(rtt_ms=5, uplink_mbps=500, downlink_mbps=500)),
                       ("poor", SimulatedLink(rtt_ms=50, uplink_mbps=20, downlink_mbps=20))):
        for upload in ("fh", "sh", "auto"):
            client, _ = _client(head, link, mode="semantic", upload=upload)
            runs[name, upload] = client.generate("semantic").until_done()
    for upload in ("fh", "sh", "auto"):
        good, poor = runs["good", upload], runs["poor", upload]
        # good link: P(reject) = sigmoid(10 q - 5) > 0.5 everywhere: greedy's output, nothing accepted
        assert good.token_ids == greedy.token_ids and good.stats.server.semantic_accepted == 0
        # poor link: every mismatch accepted, so blocks are accepted whole
        assert poor.stats.server.semantic_accepted > 0 and poor.token_ids != greedy.token_ids
        assert poor.stats.accepted == poor.stats.drafted
        assert poor.stats.rounds < greedy.stats.rounds
        assert poor.stats.accepted_length > greedy.stats.accepted_length
        for r in (good, poor):
            assert r.stats.semantic_head == head.identity and r.stats.semantic_threshold == 0.5
            assert r.stats.mode == "semantic"
        assert sum(d.server.semantic_accepted for d in poor.stats.rounds_detail) == poor.stats.server.semantic_accepted
    assert greedy.stats.server.semantic_accepted == 0 and greedy.stats.semantic_head == ""


def test_threshold_zero_is_greedy_and_one_accepts_every_mismatch(head):
    greedy = _client(None, upload="fh")[0].generate("t").until_done()
    poor = SimulatedLink(rtt_ms=50, uplink_mbps=20, downlink_mbps=20)
    strict = _client(head, poor, mode="semantic", upload="fh", semantic_threshold=0.0)[0].generate("t").until_done()
    assert strict.token_ids == greedy.token_ids and strict.stats.semantic_threshold == 0.0
    lenient = _client(head, mode="semantic", upload="fh", semantic_threshold=1.0)[0].generate("t").until_done()
    assert lenient.stats.accepted == lenient.stats.drafted and lenient.stats.server.semantic_accepted > 0


def test_the_verifier_counts_semantic_rounds_and_accepted_mismatches(head):
    client, verifier = _client(head, mode="semantic", upload="fh", semantic_threshold=1.0)
    result = client.generate("count").until_done()
    snap = verifier.service.stats.snapshot()
    assert snap.semantic_rounds == result.stats.rounds
    assert snap.semantic_accepted == result.stats.server.semantic_accepted > 0
    info = client.transport.handshake(client.draft.fingerprint(), draft_model="x", draft_hidden_size=D_DRAFT)
    assert "semantic" in info.modes and info.semantic_head == head.identity and info.semantic_threshold == 0.5


# -- refusals ------------------------------------------------------------------------------------


def test_semantic_mode_needs_uploads_and_a_threshold_in_range():
    with pytest.raises(ConfigError, match="upload"):
        GenerationConfig(mode="semantic")
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="semantic_threshold"):
            GenerationConfig(mode="semantic", upload="fh", semantic_threshold=bad)


def test_a_verifier_without_a_head_refuses_the_mode_clearly():
    client, verifier = _client(None, mode="semantic", upload="fh")
    with pytest.raises(ConfigError, match=r"offers: greedy, sample\); it needs a semantic decision head"):
        client.generate("x").until_done()
    info = verifier.handshake(client.draft.fingerprint(), draft_model="x", draft_hidden_size=D_DRAFT)
    assert "semantic" not in info.modes
    with pytest.raises(ProtocolError, match="--semantic-head"):
        verifier.open_session(
            OpenRequest([1, 2, 3], mode="semantic", seed=0, draft=client.draft.fingerprint(),
                        draft_hidden_size=D_DRAFT, semantic_threshold=0.5)
        )


def test_bad_semantic_sessions_are_refused_and_nothing_is_opened(head):
    client, verifier = _client(head)
    fp = client.draft.fingerprint()
    open_ = dict(mode="semantic", seed=0, draft=fp)
    with pytest.raises(ProtocolError, match=r"\[0, 1\]"):
        verifier.open_session(OpenRequest([1, 2, 3], **open_, draft_hidden_size=D_DRAFT, semantic_threshold=1.5))
    with pytest.raises(ProtocolError, match="draft_hidden_size"):
        verifier.open_session(OpenRequest([1, 2, 3], **open_, draft_hidden_size=0, semantic_threshold=0.5))
    with pytest.raises(ProtocolError, match="16-wide draft") as err:
        verifier.open_session(OpenRequest([1, 2, 3], **open_, draft_hidden_size=640, semantic_threshold=0.5))
    assert "trained for toy" in str(err.value) and err.value.code == "FAILED_PRECONDITION"
    assert len(verifier.service.sessions) == 0
    # the client with a draft of the wrong width hears the same
    wrong, _ = _client(head, n_embd=640, mode="semantic", upload="fh")
    with pytest.raises(ProtocolError, match="16-wide draft"):
        wrong.generate("x").until_done()


def test_a_tokens_only_round_is_refused_and_the_session_stays_usable(head):
    client, verifier = _client(head)
    from edgekit.protocol import BlockRequest

    fp = client.draft.fingerprint()
    opened = verifier.open_session(OpenRequest([1, 2, 3], mode="semantic", seed=0, draft=fp,
                                   draft_hidden_size=D_DRAFT, semantic_threshold=0.5))
    with pytest.raises(ProtocolError, match="not tokens only"):
        verifier.verify(BlockRequest(opened.session_id, 3, [4, 5], upload="tokens"))
    rows = np.ones((2, D_DRAFT), dtype=np.float32)
    v = verifier.verify(BlockRequest(opened.session_id, 3, [4, 5], upload="fh", hidden=rows))
    assert v.committed_length >= 4 and v.semantic_head == head.identity
    # a round without a draft (plain target step) needs no rows
    v2 = verifier.verify(BlockRequest(opened.session_id, v.committed_length, [], upload="tokens"))
    assert v2.committed_length == v.committed_length + 1


def test_heads_that_do_not_fit_are_refused(tmp_path):
    with pytest.raises(SemanticHeadError, match="no semantic head"):
        SemanticHead(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not onnx")
    with pytest.raises(SemanticHeadError, match="not a usable ONNX"):
        SemanticHead(tmp_path / "junk.onnx")
    from edgekit.predictors import shipped_cards

    predictor = shipped_cards()[0]["path"]  # a rejection predictor is not a head
    with pytest.raises(SemanticHeadError, match="not an edgekit semantic head"):
        SemanticHead(predictor)
    head = _quality_head(tmp_path / "h.onnx", d_target=12)
    with pytest.raises(SemanticHeadError, match="12-wide target"):
        toy_verifier(ToyLanguageModel(seed=5), semantic_head=head)
    with pytest.raises(SemanticHeadError, match="do not pair up"):
        head.p_reject(np.zeros((2, D_DRAFT)), np.zeros((3, 12)), None)


def test_a_head_without_csi_ignores_the_link(tmp_path):
    head = _quality_head(tmp_path / "nocsi.onnx", csi=False, bias=2.0)
    assert not head.uses_csi and head.width == D_DRAFT + D_TARGET
    p_good = head.p_reject(np.zeros((1, D_DRAFT)), np.zeros((1, D_TARGET)), GOOD_LINK)
    p_poor = head.p_reject(np.zeros((1, D_DRAFT)), np.zeros((1, D_TARGET)), POOR_LINK)
    assert p_good == pytest.approx(p_poor)


# -- the command line ------------------------------------------------------------------------------


@pytest.fixture()
def cli_clients(monkeypatch, tmp_path):
    """`edgekit chat` and `generate` over a toy verifier whose head accepts what the threshold lets it."""
    from edgekit.cli import _connect as cli_client  # private: where the CLI builds its client, swapped for a toy one

    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    head = _quality_head(tmp_path / "cli.onnx")
    made = []

    def build_client(*, generation, with_head=True, **_):
        client, _ = _client(head if with_head else None)
        client.generation = generation
        made.append(client)
        return client

    monkeypatch.setattr(cli_client, "build_client", build_client)
    return made, head


def test_generate_and_chat_in_semantic_mode_report_what_the_head_did(cli_clients):
    from _transcript import GENERATION, normalise, normalise_json, transcript
    from typer.testing import CliRunner

    from edgekit.cli.app import app

    runner = CliRunner()
    made, head = cli_clients
    r = runner.invoke(app, ["generate", "-p", "x", "-n", "40", "--mode", "semantic", "--semantic-threshold", "1",
                            "--drafting", "fixed", "-k", "6", "--json"])
    assert r.exit_code == 0 and r.stderr == "", r.output
    # upload auto sends FH or SH each round, as the latency model expects faster on the measured link
    uploads = {"uploads": "<uploads>", **dict.fromkeys(("exchanges", "uplink_bytes", "downlink_bytes", "hidden_rows"),
                                                       "<n>")}
    assert normalise_json(r.stdout, {**GENERATION, **uploads}, {head.identity: "<head>"}) == transcript(
        "generate-semantic-toy.json"
    )
    assert made[-1].generation.upload == "auto"  # semantic mode uploads hidden states by default
    r = runner.invoke(app, ["chat", "--mode", "semantic", "--semantic-threshold", "1", "-n", "30", "--no-history",
                            "--drafting", "fixed", "--plain"], input="hello\n/stats\n/exit\n", env={"COLUMNS": "2000"})
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert normalise(r.stdout, {head.identity: "<head>"}) == (
        "vcmvtoxjiulmxlgyplpfqlgyplplsa\n"
        "[30 tokens · <tok/s> · acceptance 1.00 · AAL 4.00 · 6 rounds · 14 mismatches accepted (semantic, head <head>, "
        "threshold 1.000) · finish: length]\n"
        "┏━┳━┳━┓\n"
        "┃ ┃ last answer ┃ conversation ┃\n"
        "┡━╇━╇━┩\n"
        "│ tokens │ 30 │ 30 │\n"
        "│ rounds │ 6 │ 6 │\n"
        "│ acceptance rate │ 1.000 │ 1.000 │\n"
        "│ accepted length (AAL, no bonus) │ 4.00 │ 4.00 │\n"
        "│ target passes per token │ 0.200 │ 0.200 │\n"
        "│ mismatches accepted (semantic: head <head>, threshold 1.000) │ 14 │ 14 │\n"
        "│ wasted draft tokens │ 0 │ 0 │\n"
        "│ tokens per second │ <tok/s> │ <tok/s> │\n"
        "│ time to first token │ <ms> │ │\n"
        "│ drafting per token │ <ms> │ │\n"
        "│ device │ <device load> │ │\n"
        "└─┴─┴─┘\n"
        "link: in-process · RTT <ms> (jitter <ms>) · up <Mbit/s> / down <Mbit/s> · loss 0.0% · numerics exact\n"
    )
    r = runner.invoke(app, ["generate", "-p", "x", "--mode", "semantic", "--upload", "tokens"])
    assert (r.stdout, r.stderr) == ("", "") and isinstance(r.exception, ConfigError)
    assert str(r.exception) == (
        "semantic mode reads the draft's hidden states at mismatches: set upload to fh, sh, auto or rtt "
        "(upload='tokens' sends none)"
    )


def test_a_threshold_outside_semantic_mode_is_refused():
    with pytest.raises(ConfigError, match="semantic mode only"):
        GenerationConfig(semantic_threshold=0.5)


class _FlakyHead(_RecordingHead):
    """Fails its first call, as a head whose runtime hiccups."""

    identity, draft_hidden, target_hidden = "flaky:0", D_DRAFT, D_TARGET

    def p_reject(self, h_draft, h_target, link, logits=None, draft_tokens=None):
        if not self.seen:
            self.seen.append(None)
            raise RuntimeError("the head failed")
        return np.full(len(h_draft), 0.9)


def test_an_sh_second_half_that_fails_can_be_sent_again():
    from edgekit.errors import InternalError
    from edgekit.protocol import BlockRequest

    head = _FlakyHead([])
    client, verifier = _client(head)
    fp = client.draft.fingerprint()
    opened = verifier.open_session(OpenRequest([1, 2, 3], mode="semantic", seed=0, draft=fp,
                                   draft_hidden_size=D_DRAFT, semantic_threshold=0.5))
    target = ToyLanguageModel(seed=5)
    best = int(np.argmax(target.logits([1, 2, 3])))
    block = [(best + 1) % target.vocab_size, 4]  # a mismatch at offset 0
    rows = np.ones((2, D_DRAFT), dtype=np.float32)
    request = BlockRequest(opened.session_id, 3, block, upload="sh", hidden=rows)
    with pytest.raises(InternalError):
        verifier.verify(request)  # the head fails in the second half
    engine = verifier.service.engine
    decoded = engine.decoded
    v = verifier.verify(request)  # sent again: the pending round is still there, no second target pass
    assert engine.decoded == decoded
    assert v.accepted == 0 and v.next_token == best and v.semantic_head == "flaky:0"


def test_the_shipped_head_fits_its_pair_and_lists_with_its_card():
    from typer.testing import CliRunner

    from edgekit.cli.app import app
    from edgekit.semantic.shipped import shipped_head, shipped_head_cards

    head = SemanticHead(shipped_head("qwen-coder"))
    assert (head.draft_hidden, head.target_hidden) == (896, 1536) and head.uses_csi  # models.md's widths
    card = next(c for c in shipped_head_cards() if c["pair"] == "qwen-coder")
    assert head.threshold == pytest.approx(card["threshold"]) and 0 <= head.threshold <= 1
    assert card["data"]["mismatches"] >= 300 and card["data"]["critical"] > 0
    r = CliRunner().invoke(app, ["semantic", "list"])
    # the figures are the card's (a retrained head brings its own)
    v = card["validation"]
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    assert r.stdout == (
        f"qwen-coder: threshold {card['threshold']:.4f}, {card['data']['mismatches']} labelled mismatches, "
        f"validation AUC {v['good_link']['auc']:.3f}; accepts {v['good_link']['accepted_share']:.0%} of mismatches on "
        f"a good link, {v['poor_link']['accepted_share']:.0%} on a poor one ({shipped_head('qwen-coder')})\n"
    )
    with pytest.raises(SemanticHeadError, match="no semantic head is shipped for pair 'gemma-270m'"):
        shipped_head("gemma-270m")
