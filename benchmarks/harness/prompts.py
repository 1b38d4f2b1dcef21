"""The benchmarks' prompt sets: `benchmarks/prompts/<name>.jsonl`, one {id, kind, prompt} a line."""

from __future__ import annotations

import json
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"
PROMPT_KINDS = ("code", "prose", "math", "list", "other-language", "rewrite")


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
