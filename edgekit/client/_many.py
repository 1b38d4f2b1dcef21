"""Many generations from one client: `concurrency` at a time, or every task of a plan at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..drafting import FixedWindow
from ..errors import ConfigError
from ..plan import Paced, Phaser, Plan
from ._events import FinalStats
from ._stream import GenerationStream

__all__ = ["generate_many"]


def generate_many(
    generate: Callable[..., GenerationStream],
    prompts: Sequence[str | Sequence[int]],
    *,
    workers: int,
    free_slots: int,
    plan: Plan | None,
    return_exceptions: bool,
    overrides: dict[str, Any],
) -> list[FinalStats | BaseException]:
    """`EdgeClient.generate_many` (its docstring says what it does), over `generate`, with
    `workers` threads and, for a plan, `free_slots` draft slots to run it in."""
    pacing: dict[int, Phaser] = {}
    if plan is not None:
        tasks = sorted(k for b in plan.batches for k in b)
        if tasks != list(range(len(prompts))):
            raise ConfigError(f"the plan covers tasks {tasks}, not the {len(prompts)} prompts given")
        if free_slots < len(prompts):
            raise ConfigError(
                f"a plan runs all {len(prompts)} tasks at once: it needs a draft slot each "
                f"(EdgeClient(draft_slots={len(prompts) + 1})), {free_slots} free"
            )
        overrides = {**overrides, "drafting": "fixed", "draft_k": plan.window}
        for batch in plan.batches:
            phaser = Phaser(len(batch))
            pacing.update({k: phaser for k in batch})
        workers = len(prompts)
        order = [k for b in plan.batches for k in b]  # started in the pipeline's order
    else:
        order = list(range(len(prompts)))

    def one(i: int) -> FinalStats | BaseException:
        phaser = pacing.get(i)
        try:
            controller = Paced(FixedWindow(plan.window), phaser) if plan and phaser else None
            return generate(prompts[i], controller=controller, **overrides).until_done()
        except Exception as exc:  # kept in its place; the others go on
            return exc
        finally:
            if phaser is not None:
                phaser.leave()  # its batch-mates no longer wait for it

    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(prompts))), thread_name_prefix="edgekit") as ex:
        done = dict(zip(order, ex.map(one, order), strict=True))
    results = [done[i] for i in range(len(prompts))]
    if not return_exceptions:
        for r in results:
            if isinstance(r, BaseException):
                raise r
    return results
