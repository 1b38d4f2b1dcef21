"""Shared by the benchmarks: the machine, prompts, JSON results and tables.

Every benchmark writes `benchmarks/results/<name>.json` holding the machine it
ran on, its settings and its figures, and prints a compact table. Timings on
the shared 2-core CPU are noisy: compare methods measured side by side in one
run (ratios), not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
PROMPTS_DIR = BENCH_DIR / "prompts"

PROMPT_KINDS = ("code", "prose", "math", "list", "other-language", "rewrite")


# -- machine -------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except ImportError:
        return None
    return getattr(mod, "__version__", None)


def _loadavg() -> str | None:
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def _edgekit_source() -> dict[str, Any] | None:
    """The git commit of the edgekit checkout that is imported, and whether its code differs from it."""
    import subprocess

    try:
        import edgekit

        root = Path(edgekit.__file__).resolve().parent.parent
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "status",
                "--porcelain",
                "--",
                "edgekit",
                "models",
                "predictors",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    return {"commit": head or None, "code_modified": bool(dirty)}


_START: dict[str, Any] = {}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cores = (
        len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count()
    )
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "llama_cpp": _version("llama_cpp"),
        "edgekit": _version("edgekit"),
        "edgekit_source": _edgekit_source(),
        "numpy": _version("numpy"),
        "edgekit_threads_env": os.environ.get("EDGEKIT_THREADS"),
        "loadavg": _loadavg(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# -- prompts -------------------------------------------------------------------------


def load_prompts(name: str = "eval", limit: int | None = None) -> list[dict[str, str]]:
    """Prompts from benchmarks/prompts/<name>.jsonl (or a path), each {id, kind, prompt}."""
    path = Path(name) if name.endswith(".jsonl") else PROMPTS_DIR / f"{name}.jsonl"
    prompts: list[dict[str, str]] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = {"id", "kind", "prompt"} - row.keys()
            if missing:
                raise ValueError(f"{path}:{n}: missing {sorted(missing)}")
            if row["kind"] not in PROMPT_KINDS:
                raise ValueError(
                    f"{path}:{n}: kind {row['kind']!r} not in {PROMPT_KINDS}"
                )
            if row["id"] in seen:
                raise ValueError(f"{path}:{n}: duplicate id {row['id']!r}")
            seen.add(row["id"])
            prompts.append(row)
    return prompts[:limit] if limit else prompts


# -- statistics ----------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def csv_list(text: str, cast=str) -> list:  # type: ignore[no-untyped-def]
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


# -- output --------------------------------------------------------------------------


def stop_process(proc: Any, grace: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if `proc` (a subprocess.Popen) has not exited within `grace` seconds."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Writes benchmarks/results/<name>.json with the machine and command line added."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    m = machine()
    m["loadavg_at_start"] = _START.get("loadavg")
    m["edgekit_source_at_start"] = _START.get("edgekit_source")
    m["loadavg_at_end"] = m.pop("loadavg")
    out = {
        "benchmark": name,
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": m,
    }
    out.update(payload)
    path = RESULTS_DIR / f"{name}.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, default=_json_default)
        f.write("\n")
    return path


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.{digits}f}"
    return str(x)


def table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 2
) -> str:
    """A Markdown-compatible table (pipes), columns padded."""
    body = [[fmt(c, digits) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h)
        for i, h in enumerate(headers)
    ]
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(r) for r in body)
    return "\n".join(out)


THREADS_HELP = (
    "llama.cpp threads for every model (sets EDGEKIT_THREADS); default 1. 0: edgekit's default (all cores). "
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


def arguments(doc: str | None, *, replot: bool = False, **defaults: Any) -> argparse.ArgumentParser:
    """A benchmark's command line: described by its module's docstring's first line, with
    `--threads` always, `--replot JSON` where the script draws a figure, and each of
    COMMON_OPTIONS given a default here (`pair="gemma-270m"`); the script adds its own options
    to it, and reads them with `parse`."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    for name, default in defaults.items():
        kind, text = COMMON_OPTIONS[name]
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=text)
    ap.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    if replot:
        ap.add_argument("--replot", metavar="JSON", default=None,
                        help="redraw the figure of a stored result beside it; measure nothing")
    return ap


def parse(ap: argparse.ArgumentParser, *, plot: Any = None) -> argparse.Namespace:
    """The command line read, its threads applied (EDGEKIT_THREADS) and the machine printed; with
    `--replot JSON`, `plot(result, png)` redraws that result's figure and the script ends there."""
    args = ap.parse_args()
    if getattr(args, "replot", None):
        replot(args.replot, plot)
        raise SystemExit(0)
    apply_threads(args.threads)
    print_machine()
    return args


def print_machine() -> None:
    m = machine()
    _START.setdefault("loadavg", m["loadavg"])
    _START.setdefault("edgekit_source", m["edgekit_source"])
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, python {m['python']}, llama_cpp {m['llama_cpp']}, "
        f"edgekit {m['edgekit']}, load {m['loadavg']}, {m['date']}",
        flush=True,
    )


def replot(path: str, plot: Any) -> None:
    """`plot(result, png)` on a stored result JSON, its PNG beside it: a figure redrawn, nothing measured."""
    plot(json.loads(Path(path).read_text(encoding="utf-8")), Path(path).with_suffix(".png"))


def progress(message: str) -> None:
    """A progress line on stderr (stdout carries the table)."""
    print(message, file=sys.stderr, flush=True)


# -- figures ---------------------------------------------------------------------------


def subplots(
    ncols: int = 1, *, nrows: int = 1, width: float = 6.0, height: float = 4.2
) -> tuple[Any, list[Any]]:
    """A matplotlib figure (no display needed) and its `nrows` x `ncols` axes, row by row (the bench extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save_figure(fig: Any, path: Path) -> Path:
    """Writes the figure as a PNG beside the benchmark's JSON, gridded and with legends, and closes it."""
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:  # labelled lines, no legend yet
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

