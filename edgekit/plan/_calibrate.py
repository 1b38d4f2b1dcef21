"""Measuring what the plan needs on this device and against this verifier.

- `calibrate_draft`: eq. 17's coefficients for the draft model here, from timed decodes of
  b = 1, 2, 4, 8 sequences at two cache lengths (FLOPs from the model's shape), the fastest
  of 7 each. Prefills are
  left out of the fit: one line through both missed decodes by 96% (MAPE) on this CPU, and
  the draft stage is l decode passes a step, a prefill once per task.
- `calibrate_verify`: the verifier's, from the verify times it reports for blocks of a few
  lengths sent 1, 2 and 4 at a time on sessions of their own, with the batch size it reports
  for each (how many blocks shared the target pass): eq. 17 fitted over b too. The target's
  shape is the verifier's business: its hidden size comes in the handshake, and its FFN is
  taken as 4x that and one block (the constant factor is in c1, fitted).
- `measured_acceptance`: the per-token acceptance of a short speculative generation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import LimitExceededError
from ..protocol import BlockRequest, Fingerprint, OpenRequest, VerifyResult
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
    repeats: int = 7,
) -> tuple[ModelShape, Runtime, Samples]:
    backend = LlamaPoolBackend(path, slots=max(batches), n_ctx_seq=max(contexts) + repeats + 9, n_threads=threads)
    try:
        shape = ModelShape.from_gguf(backend.vocab.meta)
        samples: Samples = []
        filler = list(range(100, 100 + max(contexts)))
        for ctx in contexts:
            for s in range(max(batches)):  # prefilled, not fitted: decode passes make up the draft stage
                backend.run([Step(s, 0, filler[:ctx])])
            for b in batches:  # the fastest of `repeats` timed decodes, after one untimed: other work on
                times = []  # the machine only ever adds time, and a busy moment would tilt the fit
                for r in range(repeats + 1):
                    t0 = time.perf_counter()
                    backend.run([Step(s, ctx + r, [filler[r]]) for s in range(b)])
                    times.append(time.perf_counter() - t0)
                samples.append((b, shape.decode_flops(ctx), float(np.min(times[1:]))))
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


@dataclass
class _Open:
    """A calibration session: where its next block starts, and its round count."""

    session_id: str
    base: int
    index: int = 0


def calibrate_verify(
    transport: VerifierTransport,
    draft: Fingerprint,
    prompt: Sequence[int],
    shape: ModelShape,
    *,
    windows: Sequence[int] = (1, 4, 8),
    concurrency: Sequence[int] = (1, 2, 4),
    repeats: int = 3,
) -> tuple[Runtime, Samples]:
    """Blocks of each window sent `c` at a time (c in `concurrency`, one session each), so that
    the verifier batches them; every verdict says how many blocks shared its target pass and how
    long that pass took, and each is one sample (b, FLOPs, seconds) of eq. 17."""
    sessions: list[_Open] = []
    samples: Samples = []
    try:
        for _ in range(max(concurrency)):
            try:
                opened = transport.open_session(
                    OpenRequest(prompt, mode="greedy", seed=0, draft=draft)
                )
            except LimitExceededError:  # a verifier with fewer free sessions: calibrate on those
                if not sessions:
                    raise
                break
            sessions.append(_Open(opened.session_id, opened.committed_length))
        levels = sorted({min(c, len(sessions)) for c in concurrency})

        def one(s: _Open, window: int) -> VerifyResult:
            block = [prompt[(s.base + j) % len(prompt)] for j in range(window)]
            v = transport.verify(BlockRequest(s.session_id, s.base, block, round_index=s.index))
            s.base, s.index = v.committed_length, s.index + 1
            return v

        with ThreadPoolExecutor(max_workers=max(concurrency), thread_name_prefix="edgekit-calibrate") as pool:
            for window in windows:
                for c in levels:
                    for _ in range(repeats):
                        bases = [s.base for s in sessions[:c]]
                        done = list(pool.map(one, sessions[:c], [window] * c))
                        for v, base in zip(done, bases, strict=True):
                            flops = shape.verify_flops(window + 1, base - 1)
                            samples.append((v.server.batch_size, flops, v.server.verify_ms / 1e3))
    finally:
        for s in sessions:
            transport.close_session(s.session_id)
    return Runtime.fit(samples), samples
