"""What a benchmark leaves: `benchmarks/results/<name>.json` (the machine, the command line, its
settings and figures), a compact table on stdout, progress on stderr."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .machine import START, machine

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def write_result(name: str, payload: dict[str, Any], folder: Path | None = None) -> Path:
    """Writes benchmarks/results/<name>.json (or `folder`/<name>.json) with the machine and command
    line added."""
    folder = folder or RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    m = machine()
    m["loadavg_at_start"] = START.get("loadavg")
    m["edgekit_source_at_start"] = START.get("edgekit_source")
    m["loadavg_at_end"] = m.pop("loadavg")
    out = {
        "benchmark": name,
        # as typed: `python -m benchmarks NAME ARGS` (or the script of a run before the package)
        "command": " ".join([Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]]),
        "machine": m,
    }
    out.update(payload)
    path = folder / f"{name}.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, default=json_default)
        f.write("\n")
    return path


def json_default(obj: Any) -> Any:
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


def progress(message: str) -> None:
    """A progress line on stderr (stdout carries the table)."""
    print(message, file=sys.stderr, flush=True)
