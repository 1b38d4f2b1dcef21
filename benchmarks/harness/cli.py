"""A benchmark's command line: the options scripts share spelled one way, `--threads`, `--replot`."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .machine import print_machine


def csv_list(text: str, cast=str) -> list:  # type: ignore[no-untyped-def]
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


THREADS_HELP = (
    "llama.cpp threads for every model (sets EDGEKIT_THREADS); 0: edgekit's default (all cores). "
    "On this shared 2-core machine, 2 threads beside other busy processes made single decodes ~20x slower "
    "(~2.2 s instead of ~0.1 s): 1 thread keeps the figures stable"
)


def apply_threads(threads: int) -> int | None:
    """Sets EDGEKIT_THREADS (read by every model edgekit loads) and returns the count, None for the default."""
    if threads > 0:
        os.environ["EDGEKIT_THREADS"] = str(threads)
        return threads
    os.environ.pop("EDGEKIT_THREADS", None)
    return None


# The options benchmarks share, each spelled and explained one way: (type, help).
COMMON_OPTIONS: dict[str, tuple[type, str]] = {
    "pair": (str, "the draft/target pair (models.md)"),
    "pairs": (str, "draft/target pairs, comma-separated"),
    "prompts": (int, "how many prompts of prompts/eval.jsonl"),
    "max_tokens": (int, "output tokens per answer"),
    "draft_k": (int, "draft tokens per block"),
    "repeats": (int, "repeats of each measurement"),
    "out": (str, "the result's name: benchmarks/results/NAME.json and NAME.png"),
}


def arguments(doc: str | None, *, replot: bool = False, threads: int | None = 1, whole_doc: bool = False,
              **defaults: Any) -> argparse.ArgumentParser:
    """A benchmark's command line, described by its module's docstring (the first line, or all of
    it with `whole_doc`), with `--threads` (default `threads`; None: the script has no models),
    `--replot JSON` where the script draws a figure, and each of COMMON_OPTIONS given a default
    here (`pair="gemma-270m"`). The script adds its own options (or subcommands, each given
    `common`) and reads them with `parse`."""
    if whole_doc:
        ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    common(ap, threads=threads, **defaults)
    if replot:
        ap.add_argument("--replot", metavar="JSON", default=None,
                        help="redraw the figure of a stored result beside it; measure nothing")
    return ap


def common(ap: argparse.ArgumentParser, *, threads: int | None = 1, **defaults: Any) -> argparse.ArgumentParser:
    """COMMON_OPTIONS named in `defaults`, and `--threads` unless `threads` is None, added to `ap`
    (a parser or a subcommand's)."""
    for name, default in defaults.items():
        kind, text = COMMON_OPTIONS[name]
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=text)
    if threads is not None:
        ap.add_argument("--threads", type=int, default=threads, help=f"{THREADS_HELP} (default {threads})")
    return ap


def parse(ap: argparse.ArgumentParser, argv: Sequence[str] | None = None, *, plot: Any = None,
          machine: bool = True) -> argparse.Namespace:
    """The command line read, its threads applied (EDGEKIT_THREADS; 0 leaves edgekit's default)
    and the machine printed (unless `machine` is false: a script whose output
    is machine-read); with `--replot JSON`, `plot(result, png)` redraws that result's figure and
    the script ends there."""
    args = ap.parse_args(argv)
    if getattr(args, "replot", None):
        replot(args.replot, plot)
        raise SystemExit(0)
    if getattr(args, "threads", None) is not None:
        apply_threads(args.threads)
    if machine:
        print_machine()
    return args


def replot(path: str, plot: Any) -> None:
    """`plot(result, png)` on a stored result JSON, its PNG beside it: a figure redrawn, nothing measured."""
    plot(json.loads(Path(path).read_text(encoding="utf-8")), Path(path).with_suffix(".png"))
