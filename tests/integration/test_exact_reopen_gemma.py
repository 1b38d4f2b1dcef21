"""A session reopened on the real gemma target gives the logits it gave before, bit for bit: its
history is prefilled and decoded as it was built (issue 52, item 1; the rebuild's logic is unit
tested in tests/unit/client/test_exact_reopen.py). Bit-identical is what it may expect: every row
is computed by the same kernels over the same cells as before (exact numerics: a calibrated
sub-batch reproduces single rows bit for bit), where a context prefilled whole would take batched
kernels over the generated spans, whose last bits differ."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.protocol import ContextSpan
from edgekit.verifier import Feed
from edgekit.verifier._rounds import rebuild_feeds  # private: the feeds a reopen replays, which no public call returns


@pytest.mark.numerics
def test_a_context_rebuilt_from_its_history_gives_the_same_logits_bit_for_bit(gemma_paths):
    """The gemma target in exact numerics: a session built by a prompt, rounds, a turn and more
    rounds (as `Rounds` feeds them), and the same context rebuilt on another sequence from its
    history, verify their next block with the same logits, bit for bit, at 100, 500 and 1,500
    tokens (past 256 only single rows are exact; past 512 gemma's sliding window drops cells)."""
    from edgekit.verifier import LlamaEngine
    from edgekit.verifier.engine import default_calibration_dir

    engine = LlamaEngine(str(gemma_paths[1]), max_context=1600, n_seq=3, max_block=8, threads=1,
                         cache_dir=default_calibration_dir())  # the calibration test_parking_gemma.py measured
    try:
        text = "Speculative decoding drafts tokens on the device; the verifier checks each block. x = [1, 2, 3]\n"
        toks = engine.model.tokenize(text * 60)
        spread = {}
        for prompt, turn_at, turn, total in ((40, 70, 10, 100), (300, 420, 30, 500), (1200, 1400, 50, 1500)):
            for seq in (0, 1, 2):
                engine.release(seq)
            tokens = list(toks[:prompt])
            engine.run_batch([Feed(0, 0, tuple(tokens[:-1]), 0)])

            _rounds(engine, toks, tokens, turn_at)
            at = len(tokens)
            tokens.extend(toks[at : at + turn])
            engine.run_batch([Feed(0, at - 1, tuple(tokens[at - 1 : -1]), 0)])
            _rounds(engine, toks, tokens, total)
            history = (ContextSpan(prompt), ContextSpan(at - prompt, True), ContextSpan(turn),
                       ContextSpan(len(tokens) - at - turn, True))
            for seq, spans in ((1, history), (2, ())):
                for feed in rebuild_feeds(seq, tokens, spans):
                    engine.run_batch([feed])
            n = len(tokens)
            outs = [engine.run_batch([Feed(seq, n - 1, (tokens[-1], *toks[n : n + 4]), 5)])[0] for seq in (0, 1, 2)]
            assert np.array_equal(outs[0], outs[1]), (n, float(np.abs(outs[0] - outs[1]).max()))
            spread[n] = float(np.abs(outs[0] - outs[2]).max())  # prefilled whole: what the history mends
        print("prefilled whole instead, the next block's logits moved by", spread)
    finally:
        engine.close()


def _rounds(engine, text: list[int], tokens: list[int], until: int) -> None:
    """Rounds on sequence 0 as `Rounds` feeds them, committing `text` until `tokens` holds `until`:
    a block of 4, two accepted and the target's next token."""
    while len(tokens) < until:
        n = len(tokens)
        engine.run_batch([Feed(0, n - 1, (tokens[-1], *text[n : n + 4]), 5)])
        tokens.extend(text[n : n + 3])
