"""Traces and task-outcome labels for the semantic head (WISV sec. V-B, Stage 1).

Greedy speculative decoding commits exactly the target's greedy text, and at
every position of it the draft proposes its own greedy token given that same
committed prefix. A mismatch is a position where the two differ. `collect`
therefore records, per task (an *episode*):

1. the target's greedy answer, one token at a time with hidden states on: at
   each position the target's final-layer, post-norm hidden state (the row the
   verifier's pass gives for that block offset) and its token;
2. one teacher-forced pass of the draft over the prompt and that answer: at
   each position the draft's greedy token and its final-layer hidden state (the
   row an FH/SH upload carries for that offset);
3. the target teacher-forced over the same answer one row at a time (the rows of
   step 1 again, bit for bit): at each mismatch its confidence
   (`confidence.TARGET_FEATURES`, from its logits row and the draft's token),
   optional head inputs;
4. the answer's outcome under the task's check.

This evaluates the draft at every position greedy speculative decoding could
ask it about (a superset: a bonus token is never drafted), without running the
rounds. Each mismatch keeps its position, both token ids and both hidden rows.

`label` then gives each mismatch its base label by task outcome: the draft's
token replaces the target's at that position, the target decodes greedily from
there to the end (the task's stops, end of text or its token limit), the
check runs on the new answer, and the mismatch is *critical* when the outcome
differs from the reference answer's. Labels are appended one line at a time
to `labels.jsonl`, so a run can stop anywhere and resume.

Layout of a trace directory: `episodes.jsonl` (one line per task: reference
tokens and text, outcome, timings), `episodes/<n>.npz` (the mismatch rows of
episode n), `labels.jsonl`, `meta.json` (pair, models, what ran). Episodes traced
before the target's confidence was recorded get it the next time `collect` runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import ConfigError
from edgekit.runtime import LlamaContext, LlamaModel
from edgekit.verifier import TARGET_FEATURES, target_features

from .tasks import Task, is_heldout

__all__ = ["Episode", "TraceSet", "collect", "label"]

Log = Callable[[str], None]


def _argmax(row: np.ndarray) -> int:
    return int(np.argmax(row))


def _cut(text: str, stops: Iterable[str]) -> tuple[str, bool]:
    """The text before the first stop string, and whether one was found."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut], cut < len(text)


class _Greedy:
    """The target decoding greedily in one KV sequence, with its hidden states on when asked."""

    def __init__(self, model: LlamaModel, n_ctx: int, threads: int | None) -> None:
        self.model = model
        self.ctx = LlamaContext(model, n_ctx=n_ctx, n_batch=512, n_threads=threads)

    def prefill(self, prompt: list[int]) -> None:
        self.ctx.truncate(0, 0)
        self.ctx.set_embeddings(False)
        self.ctx.decode_sequence(prompt[:-1], 0, 0, last_output=False)

    def replay(self, tokens: list[int], start: int, at: Callable[[int], None] | None = None) -> None:
        """Decodes `tokens` from position `start` one row at a time, as `run` decodes, so that the
        KV and each row's logits are the ones greedy decoding computed there, bit for bit (a batch
        takes other kernels, whose last bits differ by CPU: on an AMD EPYC a batched pass over a
        200-token gemma answer moved its logits by up to 3 and flipped an argmax). `at(i)` is
        called once row i's logits are in `ctx.logits(0)` (without it no logits are computed: the
        KV is the same either way)."""
        for i, tok in enumerate(tokens):
            self.ctx.decode([tok], [start + i], [0], [at is not None])
            if at is not None:
                at(i)

    def run(
        self, start: int, first: int, done: list[int], task: Task, *, hidden: bool
    ) -> tuple[list[int], list[np.ndarray]]:
        """Feeds `first` at position `start` and decodes greedily after it until the
        task's answer ends; `done` is the answer so far (before `first`). Returns the
        answer's new tokens (the ones decoded here, `first` not included) and, with
        `hidden`, the hidden state of each row that predicted one."""
        self.ctx.set_embeddings(hidden)
        out: list[int] = []
        rows: list[np.ndarray] = []
        tok, pos = first, start
        answer = list(done)
        self.ctx.truncate(0, pos)  # what followed `start` (a previous continuation) goes
        while len(answer) < task.max_tokens:
            self.ctx.decode([tok], [pos], [0], [True])
            nxt = _argmax(self.ctx.logits(0))
            if hidden:
                rows.append(self.ctx.hidden(0).copy())
            out.append(nxt)
            answer.append(nxt)
            pos += 1
            tok = nxt
            if self.model.is_eog(nxt):
                break
            if task.stops and _cut(self.model.detokenize(answer[-24:]), task.stops)[1]:
                break
        return out, rows


def _target_features_at(
    target: _Greedy, prompt: list[int], answer: list[int], offsets: Iterable[int], draft_tokens: Iterable[int]
) -> np.ndarray:
    """`TARGET_FEATURES` at these answer offsets: the target teacher-forced over the answer as
    `_Greedy.run` decoded it (`replay`), so each row's logits are the ones that chose the answer's
    token there, as the verifier's exact numerics give them (one batched pass is ~2x cheaper, but
    its features were up to 0.9 off). Only the rows up to the last asked-for offset run."""
    want = dict(zip((int(o) for o in offsets), (int(t) for t in draft_tokens)))
    out = np.zeros((len(want), len(TARGET_FEATURES)), dtype=np.float32)
    if not want:
        return out
    row_of = {o: i for i, o in enumerate(want)}

    def keep(offset: int) -> None:
        if offset in want:
            out[row_of[offset]] = target_features(target.ctx.logits(0)[None, :], [want[offset]])[0]

    target.prefill(prompt)
    target.ctx.set_embeddings(True)  # as the reference answer was decoded (hidden rows on)
    target.replay([prompt[-1], *answer[: max(want)]], len(prompt) - 1, keep)
    return out


def _save_rows(path: Path, **arrays: Any) -> None:
    """Writes an episode's rows whole (a temporary file renamed over the old one)."""
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


@dataclass
class Episode:
    index: int
    task_id: str
    prompt_tokens: int
    answer: list[int]  # the target's greedy answer tokens
    text: str  # the answer text after the stops are cut
    passed: bool
    positions: np.ndarray  # answer offsets of the mismatches
    draft_tokens: np.ndarray
    target_tokens: np.ndarray
    h_draft: np.ndarray  # [m, draft hidden] float16
    h_target: np.ndarray  # [m, target hidden] float16
    target_features: np.ndarray | None  # [m, len(TARGET_FEATURES)] float32 (None: traced before they were kept)


class TraceSet:
    """A trace directory: its episodes and labels, read back."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not (self.root / "episodes.jsonl").is_file():
            raise ConfigError(f"{self.root} holds no traces (no episodes.jsonl); run `edgekit semantic collect`")
        self.meta = json.loads((self.root / "meta.json").read_text())
        self.episodes = [json.loads(line) for line in (self.root / "episodes.jsonl").read_text().splitlines() if line]

    def rows(self, index: int) -> dict[str, np.ndarray]:
        with np.load(self.root / "episodes" / f"{index}.npz") as z:
            return {k: z[k] for k in z.files}

    def labels(self) -> dict[tuple[int, int], dict]:
        """(episode, answer offset) -> its label record."""
        path = self.root / "labels.jsonl"
        if not path.is_file():
            return {}
        out = {}
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[(rec["episode"], rec["position"])] = rec
        return out


def _prompt_tokens(model: LlamaModel, task: Task) -> list[int]:
    if not task.chat:
        return model.tokenize(task.prompt)
    from edgekit import ChatTemplate

    template = ChatTemplate(model.chat_template())
    text = template.render([{"role": "user", "content": task.prompt}], add_generation_prompt=True)
    return model.tokenize(text, add_special=False)


def collect(
    tasks: list[Task],
    draft_path: str | Path,
    target_path: str | Path,
    out: str | Path,
    *,
    pair: str = "",
    threads: int | None = None,
    n_ctx: int = 2048,
    log: Log = print,
) -> Path:
    """Reference answers, mismatches and hidden rows for each task not yet in `out`."""
    out = Path(out)
    held_out = [t.id for t in tasks if is_heldout(t.id)]
    if held_out:
        raise ConfigError(
            f"{len(held_out)} held-out HumanEval problems ({', '.join(held_out[:3])}, ...) among the tasks: "
            "they are for evaluation only; trace humaneval:train"
        )
    (out / "episodes").mkdir(parents=True, exist_ok=True)
    draft_m = LlamaModel(draft_path)
    target_m = LlamaModel(target_path)
    if not draft_m.fingerprint().same_tokenizer(target_m.fingerprint()):
        raise ConfigError(f"{draft_m.name} and {target_m.name} do not share a tokenizer: not a speculative pair")
    meta_path = out / "meta.json"
    meta = {
        "pair": pair,
        "draft": draft_m.name,
        "target": target_m.name,
        "draft_hidden": draft_m.n_embd,
        "target_hidden": target_m.n_embd,
    }
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in meta} != meta:
            raise ConfigError(f"{out} holds traces of another pair ({old.get('draft')} -> {old.get('target')})")
    meta_path.write_text(json.dumps(meta, indent=1))
    done = {e["task_id"] for e in TraceSet(out).episodes} if (out / "episodes.jsonl").is_file() else set()
    index = len(done)
    target = _Greedy(target_m, n_ctx, threads)
    draft_ctx = LlamaContext(draft_m, n_ctx=n_ctx, n_batch=512, n_threads=threads)
    with open(out / "episodes.jsonl", "a", encoding="utf-8") as episodes:
        for task in tasks:
            if task.id in done:
                continue
            t0 = time.perf_counter()
            prompt = _prompt_tokens(target_m, task)
            if len(prompt) + task.max_tokens + 2 > n_ctx:
                log(f"skip {task.id}: prompt of {len(prompt)} tokens too long")
                continue
            target.prefill(prompt)
            answer, t_rows = target.run(len(prompt) - 1, prompt[-1], [], task, hidden=True)
            text, _ = _cut(target_m.detokenize(answer), task.stops)
            passed = task.check(text)
            t1 = time.perf_counter()
            # The draft, teacher-forced over the same answer: its token and hidden row at each offset.
            draft_ctx.truncate(0, 0)
            draft_ctx.set_embeddings(False)
            draft_ctx.decode_sequence(prompt[:-1], 0, 0, last_output=False)
            draft_ctx.set_embeddings(True)
            feed = [prompt[-1], *answer[:-1]]
            d_tok: list[int] = []
            d_rows: list[np.ndarray] = []
            start = len(prompt) - 1
            for lo in range(0, len(feed), 256):
                chunk = feed[lo : lo + 256]
                n = len(chunk)
                draft_ctx.decode(chunk, range(start + lo, start + lo + n), [0] * n, [True] * n)
                for i in range(len(chunk)):
                    d_tok.append(_argmax(draft_ctx.logits(i)))
                    d_rows.append(draft_ctx.hidden(i).copy())
            mism = [j for j in range(len(answer)) if d_tok[j] != answer[j]]
            _save_rows(
                out / "episodes" / f"{index}.npz",
                positions=np.asarray(mism, dtype=np.int32),
                draft_tokens=np.asarray([d_tok[j] for j in mism], dtype=np.int32),
                target_tokens=np.asarray([answer[j] for j in mism], dtype=np.int32),
                h_draft=np.asarray([d_rows[j] for j in mism], dtype=np.float16).reshape(len(mism), draft_m.n_embd),
                h_target=np.asarray([t_rows[j] for j in mism], dtype=np.float16).reshape(len(mism), target_m.n_embd),
                target_features=_target_features_at(target, prompt, answer, mism, [d_tok[j] for j in mism]),
            )
            rec = {
                "index": index,
                "task_id": task.id,
                "prompt_tokens": len(prompt),
                "answer": answer,
                "text": text,
                "passed": passed,
                "mismatches": len(mism),
                "target_s": round(t1 - t0, 3),
                "draft_s": round(time.perf_counter() - t1, 3),
            }
            episodes.write(json.dumps(rec) + "\n")
            episodes.flush()
            log(f"{task.id}: {len(answer)} tokens, {'pass' if passed else 'fail'}, {len(mism)} mismatches "
                f"({time.perf_counter() - t0:.1f} s)")
            index += 1
    draft_ctx.close()
    _add_target_features(TraceSet(out), {t.id: t for t in tasks}, target, log)
    target.ctx.close()
    return out


def _add_target_features(traces: TraceSet, tasks: dict[str, Task], target: _Greedy, log: Log) -> None:
    """The target's confidence for episodes traced before it was recorded (of the tasks given)."""
    for ep in traces.episodes:
        rows = traces.rows(ep["index"])
        if "target_features" in rows or ep["task_id"] not in tasks:
            continue
        prompt = _prompt_tokens(target.model, tasks[ep["task_id"]])
        rows["target_features"] = _target_features_at(
            target, prompt, ep["answer"], rows["positions"], rows["draft_tokens"]
        )
        _save_rows(traces.root / "episodes" / f"{ep['index']}.npz", **rows)
        log(f"{ep['task_id']}: the target's confidence at {len(rows['positions'])} mismatches added")


def label(
    tasks: list[Task],
    target_path: str | Path,
    root: str | Path,
    *,
    threads: int | None = None,
    n_ctx: int = 2048,
    limit: int | None = None,
    deadline_s: float | None = None,
    log: Log = print,
) -> int:
    """Task-outcome labels for the traced mismatches not yet labelled, a whole episode at a
    time (relabeling reads whole episodes), the cheapest first: an episode costs about the
    tokens its continuations decode, the sum over its mismatches of the answer's length past
    them, so a budget buys the most labels (an answer that ran to the token limit costs that
    limit per mismatch). Stops after `limit` new labels or `deadline_s` seconds; returns how
    many it added."""
    traces = TraceSet(root)
    by_id = {t.id: t for t in tasks}
    have = traces.labels()
    target_m = LlamaModel(target_path)
    if target_m.name != traces.meta["target"]:
        raise ConfigError(f"{traces.root} was traced with target {traces.meta['target']}, not {target_m.name}")
    runner = _Greedy(target_m, n_ctx, threads)
    t_start = time.perf_counter()
    added = 0
    def cost(ep: dict) -> int:
        pos = traces.rows(ep["index"])["positions"]
        return sum(len(ep["answer"]) - int(p) for p in pos if (ep["index"], int(p)) not in have)

    unknown = sorted({ep["task_id"] for ep in traces.episodes} - set(by_id))
    if unknown:
        log(f"{len(unknown)} traced tasks are not among the tasks given ({', '.join(unknown[:3])}, ...): "
            "their episodes are not labelled")
    with open(traces.root / "labels.jsonl", "a", encoding="utf-8") as f:
        for ep in sorted(traces.episodes, key=cost):
            task = by_id.get(ep["task_id"])
            if task is None:
                continue
            rows = traces.rows(ep["index"])
            todo = [
                (int(p), int(d)) for p, d in zip(rows["positions"], rows["draft_tokens"])
                if (ep["index"], int(p)) not in have
            ]
            if not todo:
                continue
            prompt = _prompt_tokens(target_m, task)
            answer = ep["answer"]
            p = len(prompt)  # answer[j] sits at position p + j
            runner.prefill(prompt)
            # The reference answer's KV once, one row at a time as it was decoded (so a continuation
            # is what greedy decoding after that prefix writes, bit for bit); each continuation
            # overwrites it from its position on, and the reference is decoded again up to the next
            # one (mismatches come in ascending order).
            runner.replay([prompt[-1], *answer[:-1]], p - 1)
            reference_upto = len(answer) - 1  # answer[:reference_upto] is in the KV
            for pos, tok in sorted(todo):
                if (limit is not None and added >= limit) or (
                    deadline_s is not None and time.perf_counter() - t_start > deadline_s
                ):
                    return added
                if reference_upto < pos:
                    runner.ctx.truncate(0, p + reference_upto)
                    runner.replay(answer[reference_upto:pos], p + reference_upto)
                t0 = time.perf_counter()
                head = [*answer[:pos], tok]
                if target_m.is_eog(tok) or (task.stops and _cut(target_m.detokenize(head[-24:]), task.stops)[1]):
                    rest: list[int] = []
                else:
                    rest, _ = runner.run(p + pos, tok, head, task, hidden=False)
                    reference_upto = pos  # the continuation took the cells from p + pos on
                text, _ = _cut(target_m.detokenize(head + rest), task.stops)
                passed = ep["passed"] if text == ep["text"] else task.check(text)
                rec = {
                    "episode": ep["index"],
                    "position": pos,
                    "task_id": task.id,
                    "critical": passed != ep["passed"],
                    "passed": passed,
                    "same_text": text == ep["text"],
                    "continuation": len(rest),
                    "seconds": round(time.perf_counter() - t0, 3),
                }
                f.write(json.dumps(rec) + "\n")
                f.flush()
                added += 1
                log(f"{task.id} @{pos}: {'critical' if rec['critical'] else 'harmless'} "
                    f"({len(rest)} tokens, {rec['seconds']:.1f} s)")
    return added
