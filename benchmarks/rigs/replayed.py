"""A target that runs for real and answers as a recorded one did (issue 51, item 2): real
acceptance on random weights.

A target with random weights (benchmarks/gpu/make_target.py) costs a GPU what the real model
costs, but accepts nothing a real draft proposes. `ReplayedLlamaEngine` is llama.cpp's engine
(`edgekit.verifier.LlamaEngine`, unchanged) that runs every forward pass a round needs (the
block's rows, the logits out, their reduction) and then, for a session whose prompt is a
recorded trace's (benchmarks/rigs/fleet_sim.py: the real target's greedy output after the
prompt), replaces each row's best token by the one the real target chose at that position: the
verifier's own acceptance rule then accepts exactly what the real target would have. Rows past
the trace's end, and sessions of other prompts, keep the random target's answer. Greedy rounds
only (the argmax ids, or whole rows whose recorded token is raised above the rest); a sampling
round's kept rows are left as they are, so its acceptance is the random target's.

    python -m benchmarks.rigs.replayed TRACES.json [edgekit serve's options ...]

serves as `edgekit serve` does, with the engine replaced. The product's verifier code is not
touched: the swap happens here, in the launcher. Figures measured this way say so.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.rigs.fleet_sim import Trace, load_traces
from edgekit.verifier import LlamaEngine
from edgekit.verifier.engine import Feed, FeedOutput, KeptRows


class Replay:
    """Each sequence's context as its feeds built it, and the recorded target's token after any
    position of a traced prompt."""

    def __init__(self, traces: Sequence[Trace]) -> None:
        self.by_prompt = {tuple(t.prompt): t for t in traces}
        self.lengths = sorted({len(t.prompt) for t in traces})
        self.context: dict[int, list[int]] = {}
        # output rows seen: answered from a trace, past its end (the random target's), of no traced prompt
        self.rows = self.replayed = self.beyond = self.untraced = 0

    def __call__(self, feed: Feed, out: FeedOutput) -> FeedOutput:
        ctx = self.context.setdefault(feed.seq, [])
        del ctx[feed.start :]
        ctx.extend(feed.tokens)
        if not feed.n_out or isinstance(out, KeptRows):
            return out
        trace = next((self.by_prompt[p] for n in self.lengths if (p := tuple(ctx[:n])) in self.by_prompt), None)
        first = len(ctx) - feed.n_out  # the position of the first output row's token
        self.rows += feed.n_out
        if trace is None:
            self.untraced += feed.n_out
            return out
        logits = out[0] if isinstance(out, tuple) else out
        for r in range(feed.n_out):
            i = first + r + 1 - len(trace.prompt)  # the row predicts the target's i-th token
            if not 0 <= i < len(trace.target):
                self.beyond += 1
                continue
            token = trace.target[i]
            if feed.argmax:
                logits[r] = token
            else:
                logits[r, token] = np.max(logits[r]) + 1.0
            self.replayed += 1
        return out


class ReplayedLlamaEngine(LlamaEngine):
    """`LlamaEngine`, its greedy rows answered from `replay` (set before the server builds it)."""

    replay: Replay | None = None

    def run_batch(self, feeds: Sequence[Feed]) -> list[FeedOutput]:
        outs = super().run_batch(feeds)
        if self.replay is None:
            return outs
        return [self.replay(f, o) for f, o in zip(feeds, outs, strict=True)]


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if args else 2)
    traces, _ = load_traces(Path(args[0]))
    ReplayedLlamaEngine.replay = Replay(traces)
    from edgekit.cli.app import main as edgekit_main
    from edgekit.verifier import _server

    _server.LlamaEngine = ReplayedLlamaEngine  # type: ignore[misc]  (the launcher's swap: see the docstring)
    sys.argv = ["edgekit", "serve", *args[1:]]
    edgekit_main()


if __name__ == "__main__":
    main()
