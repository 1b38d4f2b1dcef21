"""Figures the README and the documentation show, redrawn from the stored results (no model is run).

    python -m benchmarks figures              # needs the bench extra (matplotlib)
    python -m benchmarks figures --out DIR    # the PNGs into DIR instead, beside nothing

Each benchmark draws its own figure when it runs; this redraws the ones listed
below from `benchmarks/results/*.json` with the benchmarks' own plot functions,
after a change to a plot or to make sure the PNGs match the JSON beside them.
tests/unit/benchmarks/test_figures.py checks that it redraws every figure README.md shows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from benchmarks import harness as C


def _load(name: str) -> dict:
    return json.loads((C.RESULTS_DIR / f"{name}.json").read_text())


def _figures(out: Path) -> list[tuple[str, Callable[[], None]]]:
    # each benchmark's `plot` (its figure from its stored result): imported here, when figures are drawn
    from benchmarks import (
        chat_loops,
        drafting_policies,
        footprint,
        install_size,
        link_sweep,
        pipeline,
        profile_drafting,
        sampling_acceptance,
        semantic,
        side_by_side,
        verifier_context,
        vllm_rounds,
    )
    from benchmarks.gpu import suite

    def png(name: str) -> Path:
        (out / name).parent.mkdir(parents=True, exist_ok=True)  # gpu/...
        return out / f"{name}.png"

    def pipeline_figure(name: str) -> None:
        d = _load(name)
        pipeline.plot(d["single"], d["multi"], d["summary"], sorted({r["tasks"] for r in d["multi"]}), png(name))

    def footprint_figure() -> None:
        d = _load("footprint_gemma-270m")
        footprint.plot([r for r in d["runs"] if r["ok"]], d["limited"], png("footprint_gemma-270m"))

    return [
        *[(f"drafting_policies-{p}", lambda p=p: drafting_policies.plot(_load(f"drafting_policies-{p}")["result"],
                                                                       png(f"drafting_policies-{p}")))
          for p in ("gemma-270m", "qwen-coder")],
        *[(n, lambda n=n: link_sweep.plot(_load(n), png(n))) for n in ("link_sweep", "link_sweep-impaired")],
        ("verifier_context", lambda: verifier_context.plot(_load("verifier_context")["results"],
                                                           png("verifier_context"))),
        ("pipeline", lambda: pipeline_figure("pipeline")),
        ("pipeline_planned", lambda: pipeline_figure("pipeline_planned")),
        ("footprint_gemma-270m", footprint_figure),
        ("install_size", lambda: install_size.plot(_load("install_size")["rows"], png("install_size"))),
        ("semantic", lambda: semantic.plot({"configs": _load("semantic")["configs"]}, png("semantic"))),
        ("profile_kernels_gemma-270m", lambda: profile_drafting.plot(_load("profile_kernels_gemma-270m")["summary"],
                                                                     png("profile_kernels_gemma-270m"))),
        *[(n, lambda n=n, m=m: m.plot(_load(n), png(n)))
          for n, m in (("sampling_acceptance", sampling_acceptance), ("chat_loops", chat_loops))],
        ("vllm_rounds", lambda: vllm_rounds.plot(_load("vllm_rounds"), png("vllm_rounds"))),
        *[(n, lambda n=n: suite.plot(_load(n), png(n)))
          for n in ("gpu/gpu_suite_h200_run1", "gpu/gpu_suite_h200_run2")],
        *[(n, lambda n=n: side_by_side.plot(_load(n), png(n)))
          for n in ("side_by_side_gemma-270m", "side_by_side_qwen-coder")],
    ]


def main() -> None:
    ap = C.arguments(__doc__, threads=None)  # no model; --out is a folder here, not the common result name
    ap.add_argument("--out", type=Path, default=C.RESULTS_DIR, help="where the PNGs go (default: beside the JSON)")
    args = C.parse(ap, machine=False)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in _figures(args.out):
        if not (C.RESULTS_DIR / f"{name}.json").is_file():
            print(f"{name}: no stored result, skipped")
            continue
        draw()


if __name__ == "__main__":
    main()
