"""Serving latency of a set of tasks (paper 003, sec. II-B and II-D, eqs. 7, 8, 18-22).

Tasks are grouped into batches processed in order through a two-stage pipeline at
every decoding step: the device drafts a batch's blocks (l draft passes, stage 1), then
the block crosses the link and the verifier checks it (stage 2). Batch m's stage 2
starts once its own stage 1 and batch m-1's stage 2 are done (eq. 20); a step ends when
the last batch is verified (eq. 21), and the steps add up (eq. 22). Every task is
assumed to run for the most output (`max_output`), as the paper does for planning:
N = ceil(O_max / L) steps with L = (1 - a^(l+1)) / (1 - a) tokens each (eqs. 7, 8).

Unlike the paper's fronthaul, this link is not negligible: each batch's stage 2 also
takes `link_s` (its round trip and transfers), and a batch of b tasks verifies as one
pass of b sequences (the verifier's engine batches concurrent rounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._cost import ModelShape, Runtime

__all__ = ["ServingModel"]


@dataclass(frozen=True)
class ServingModel:
    draft: ModelShape
    verify: ModelShape
    draft_runtime: Runtime
    verify_runtime: Runtime
    acceptance: float  # per-token acceptance rate a
    max_output: int  # O_max: tokens every task is planned for
    link_s: float = 0.0  # each batch's link time per step (round trip and transfers)
    memory_bytes: float = math.inf  # what the draft may hold: weights and the batch's KV (constraint 24b)

    def tokens_per_step(self, window: int) -> float:
        """Eq. 7: L, the tokens a step commits per task."""
        a = min(max(self.acceptance, 0.0), 0.999999)
        return (1 - a ** (window + 1)) / (1 - a)

    def steps(self, window: int) -> int:
        """Eq. 8: N = ceil(O_max / L)."""
        return math.ceil(self.max_output / self.tokens_per_step(window) - 1e-9)

    def fits(self, size: int, longest_input: int) -> bool:
        """Constraint 24b: the draft's weights and the batch's KV cache fit in memory."""
        kv = size * self.draft.kv_bytes_per_token * (longest_input + self.max_output)
        return self.draft.param_bytes + kv <= self.memory_bytes

    def stage_times(self, size: int, longest_input: int, window: int) -> tuple[np.ndarray, np.ndarray]:
        """Each step's draft time (eq. 19) and verify-and-link time (eq. 18 plus the link) for a
        batch of `size` tasks padded to `longest_input` tokens."""
        n_steps = self.steps(window)
        step_tokens = self.tokens_per_step(window)
        draft = np.empty(n_steps)
        verify = np.empty(n_steps)
        for n in range(1, n_steps + 1):
            total = 0.0
            for i in range(1, window + 1):
                if n == 1 and i == 1:
                    flops = self.draft.prefill_flops(longest_input)
                else:
                    cached = longest_input + (n - 1) * step_tokens - 1 + i - 1  # I^kv_{i,n} (after eq. 13)
                    flops = self.draft.decode_flops(int(cached))
                total += self.draft_runtime.seconds(size, flops)
            draft[n - 1] = total
            if n == 1:
                vflops = self.verify.verify_flops(longest_input + window, 0)
            else:
                cached = longest_input + (n - 1) * step_tokens - 1
                vflops = self.verify.verify_flops(1 + window, int(cached))
            verify[n - 1] = self.verify_runtime.seconds(size, vflops) + self.link_s
        return draft, verify

    def latency(self, batches: Sequence[Sequence[int]], inputs: Sequence[int], window: int) -> float:
        """Eqs. 20-22: total inference time of `batches` (task indices, in pipeline order)."""
        n_steps = self.steps(window)
        first = np.zeros(n_steps)  # C^d_{n,m}: when stage 1 has done batches 1..m, per step
        both = np.zeros(n_steps)  # C_{n,m}: when both stages have
        for batch in batches:
            d, v = self.stage_times(len(batch), max(inputs[k] for k in batch), window)
            first = first + d
            both = np.maximum(first, both) + v
        return float(both.sum())
