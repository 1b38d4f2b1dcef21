"""Measuring what the plan needs on this device and against this verifier.

- `calibrate_draft`: eq. 17's coefficients for the draft model here, from timed decodes of
  b = 1, 2, 4, 8 sequences at two cache lengths (FLOPs from the model's shape). Prefills are
  left out of the fit: one line through both missed decodes by 96% (MAPE) on this CPU, and
  the draft stage is l decode passes a step, a prefill once per task.
- `calibrate_verify`: the verifier's, from the verify times it reports for blocks of a few
  lengths on one session (batch size 1: eq. 17 carries it to larger batches). The target's
  shape is the verifier's business: its hidden size comes in the handshake, and its FFN is
  taken as 4x that and one block (the constant factor is in c1, fitted).
- `measured_acceptance`: the per-token acceptance of a short speculative generation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np

from ..protocol import BlockRequest, Fingerprint
from ..runtime import LlamaPoolBackend, Step
from ..transport import VerifierTransport
from ._cost import ModelShape, Runtime

__all__ = ["calibrate_draft", "calibrate_verify", "verifier_shape"]

Samples = list[tuple[int, float, float]]


def calibrate_draft(
    path: str | os.PathLike[str],
    *,
    threads: int | None = None,
    batches: Sequence[int] = (1, 2, 4, 8),
    contexts: Sequence[int] = (32, 256),
    repeats: int = 5,
) -> tuple[ModelShape, Runtime, Samples]:
    backend = LlamaPoolBackend(path, slots=max(batches), n_ctx_seq=max(contexts) + repeats + 9, n_threads=threads)
    try:
        shape = ModelShape.from_gguf(backend.vocab.meta)
        samples: Samples = []
        filler = list(range(100, 100 + max(contexts)))
        for ctx in contexts:
            for s in range(max(batches)):  # prefilled, not fitted: decode passes make up the draft stage
                backend.run([Step(s, 0, filler[:ctx])])
            for b in batches:  # the median of `repeats` timed decodes, after one untimed
                times = []
                for r in range(repeats + 1):
                    t0 = time.perf_counter()
                    backend.run([Step(s, ctx + r, [filler[r]]) for s in range(b)])
                    times.append(time.perf_counter() - t0)
                samples.append((b, shape.decode_flops(ctx), float(np.median(times[1:]))))
                for s in range(b):
                    backend.truncate(s, ctx)
            for s in range(max(batches)):
                backend.truncate(s, 0)
    finally:
        backend.close()
    return shape, Runtime.fit(samples), samples


def verifier_shape(hidden_size: int) -> ModelShape:
    """The target's shape as far as the plan needs it (see the module)."""
    return ModelShape(1, hidden_size, 4 * hidden_size)


def calibrate_verify(
    transport: VerifierTransport,
    draft: Fingerprint,
    prompt: Sequence[int],
    shape: ModelShape,
    *,
    windows: Sequence[int] = (1, 4, 8),
    repeats: int = 3,
) -> tuple[Runtime, Samples]:
    opened = transport.open_session(prompt, mode="greedy", temperature=1.0, seed=0, draft=draft)
    samples: Samples = []
    base, index = opened.committed_length, 0
    try:
        for window in windows:
            for _ in range(repeats):
                block = [prompt[(base + j) % len(prompt)] for j in range(window)]
                v = transport.verify(BlockRequest(opened.session_id, base, block, round_index=index))
                samples.append((1, shape.verify_flops(window + 1, base - 1), v.verify_ms / 1e3))
                base, index = v.committed_length, index + 1
    finally:
        transport.close_session(opened.session_id)
    return Runtime.fit(samples), samples
