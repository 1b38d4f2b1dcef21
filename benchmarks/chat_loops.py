"""Does `edgekit chat` stop looping? Multi-turn chats under the chat defaults and under greedy (issue 35).

Issue 35's done-when: "With the defaults, the palindrome follow-up and at least 9 of 10
multi-turn chats of your own (code and prose, qwen-coder) end on end-of-text, not the token
limit; --greedy is still token-identical to target-only decoding."

On qwen-coder (Qwen2.5-Coder 0.5B draft, 1.5B target, in-process loopback verifier, exact
numerics), every chat below runs as a `Conversation` (the target's chat template, one verifier
session, KV reused across turns), max 512 tokens per answer:

- the palindrome conversation ("Write a Python function that checks whether a string is a
  palindrome", then "Now add type hints and a doctest"), under the defaults with 3 seeds;
- 10 chats of 2-3 turns written for this benchmark (6 code, 4 prose), under the defaults with
  1 seed (--seeds N for more);
- all of them under greedy (`edgekit chat --greedy`: mode greedy, no penalty).

"The defaults" are what `edgekit chat` samples with (cli/chat.py CHAT_SAMPLING: temperature 0.7,
top-p 0.9, min-p 0.05, repetition penalty 1.1), with whatever the model's GGUF recommends
(`general.sampling.*`) winning, as the command does. The draft window is fixed (drafting "fixed",
K=4) instead of the command's "auto" (predictor, and plain target decoding when the latency
model expects it faster): the output distribution is the same for any drafting policy (lossless),
and a fixed window keeps a seed's answer reproducible (the auto policy's choices depend on
measured timings).

Per answer: finish reason (eos / length), completion tokens, acceptance, and loop flags: the
longest tandem repeat in the answer's tokens (an n-gram repeated back to back: period, copies,
tokens covered, whether it reaches the end) and the most repeated non-trivial line in the text of
its last 200 tokens. `looped` = a tandem repeat of >= 3 copies covering >= 48 tokens, or a
non-trivial line (>= 8 non-blank characters, a letter or digit among them) >= 3 times in the last
200 tokens.

Greedy lossless check: the palindrome chat's turn 1 and turn 2 prompts rendered with the chat
template (`chat_template().render(messages, add_generation_prompt=True)`, turn 2's history holding
greedy turn 1's answer), decoded by `generate` (speculative, greedy) and `generate_target_only`
(the target alone, greedy): token ids must be equal (--identity-chats N adds the last turn of the
first N other chats).

    python -m benchmarks chat_loops                          # ~30-40 min on the shared 2-core machine
    python -m benchmarks chat_loops --chats palindrome,email --max-tokens 128    # smoke run
    python -m benchmarks chat_loops --plot-only              # redraw the PNG from the JSON
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks import harness as C
from edgekit import EdgeClient, GenerationConfig, ServerConfig
from edgekit.cli.chat import CHAT_SAMPLING  # the chat command's defaults, as it applies them
from edgekit.models import get_pair

NAME = "chat_loops"


PALINDROME = {
    "id": "palindrome",
    "kind": "code",
    "turns": [
        "Write a Python function that checks whether a string is a palindrome",
        "Now add type hints and a doctest",
    ],
}

# Ten chats of our own: 6 code, 4 prose; 2-3 turns, follow-ups that build on the answer.
CHATS = [
    {"id": "merge-sorted", "kind": "code", "turns": [
        "Write a Python function that merges two sorted lists into one sorted list.",
        "Make it work for any number of sorted lists, using heapq.",
    ]},
    {"id": "pandas-csv", "kind": "code", "turns": [
        "How do I read a large CSV file with pandas without running out of memory?",
        "Show how to compute the mean of one column that way.",
    ]},
    {"id": "sql-salary", "kind": "code", "turns": [
        "Write a SQL query that finds the second highest salary in an employees table.",
        "Now return the second highest salary for each department.",
    ]},
    {"id": "retry-decorator", "kind": "code", "turns": [
        "Explain what a Python decorator is, with a short example.",
        "Write a decorator that retries a function up to 3 times when it raises an exception.",
        "Add an exponential backoff between the retries.",
    ]},
    {"id": "bash-count", "kind": "code", "turns": [
        "Write a bash one-liner that counts the lines of all .py files in a directory tree.",
        "Exclude files under any directory named venv.",
    ]},
    {"id": "js-debounce", "kind": "code", "turns": [
        "Write a JavaScript function that debounces another function.",
        "Convert it to TypeScript with proper types.",
        "How would I test it with Jest fake timers?",
    ]},
    {"id": "email", "kind": "prose", "turns": [
        "Write a short email to my landlord asking them to fix a leaking kitchen tap.",
        "Make it more formal, and mention that it has been leaking for two weeks.",
    ]},
    {"id": "tcp-udp", "kind": "prose", "turns": [
        "Explain the difference between TCP and UDP to a beginner.",
        "Give three real-world applications of each.",
    ]},
    {"id": "bakery", "kind": "prose", "turns": [
        "Suggest a name for a small bakery that specializes in sourdough bread.",
        "Write a two-sentence slogan for it.",
        "Now write a short Instagram post announcing the opening.",
    ]},
    {"id": "french-revolution", "kind": "prose", "turns": [
        "Summarize the causes of the French Revolution in one paragraph.",
        "What happened to Louis XVI afterwards?",
    ]},
]

# Run order: code and prose alternating, so that a run cut short still holds both.
_ORDER = ["merge-sorted", "email", "pandas-csv", "tcp-udp", "sql-salary", "bakery", "retry-decorator",
          "french-revolution", "bash-count", "js-debounce"]
ALL_CHATS = [PALINDROME, *sorted(CHATS, key=lambda c: _ORDER.index(c["id"]))]


# -- loop detection ----------------------------------------------------------------------


def tandem_repeat(tokens: list[int], max_period: int = 128) -> dict:
    """The longest run where the tokens repeat with some period p (an n-gram back to back):
    period, copies (run length / p), tokens covered and whether the run reaches the end."""
    n = len(tokens)
    best = {"period": 0, "copies": 1.0, "tokens": 0, "at_end": False}
    for p in range(1, min(max_period, n // 2) + 1):
        run = 0
        for i in range(n - p):
            if tokens[i] == tokens[i + p]:
                run += 1
                covered = run + p
                if covered > best["tokens"] and covered >= 2 * p:
                    best = {"period": p, "copies": covered / p, "tokens": covered, "at_end": i + p == n - 1}
            else:
                run = 0
    return best


def tail_repeat(tokens: list[int], max_period: int = 128) -> dict:
    """The periodic run that ends at the answer's last token (the loop it was cut in), if any."""
    n = len(tokens)
    best = {"period": 0, "copies": 1.0, "tokens": 0}
    for p in range(1, min(max_period, n // 2) + 1):
        run = 0
        i = n - 1 - p
        while i >= 0 and tokens[i] == tokens[i + p]:
            run += 1
            i -= 1
        covered = run + p
        if covered >= 2 * p and covered > best["tokens"]:
            best = {"period": p, "copies": covered / p, "tokens": covered}
    return best


def repeated_line(text: str) -> dict:
    """The most frequent non-trivial line (>= 8 non-blank characters, one alphanumeric at least)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        s = line.strip()
        if len(s.replace(" ", "")) >= 8 and any(ch.isalnum() for ch in s):
            counts[s] = counts.get(s, 0) + 1
    if not counts:
        return {"line": None, "count": 0}
    line, count = max(counts.items(), key=lambda kv: kv[1])
    return {"line": line[:80], "count": count}


def loop_flags(client: EdgeClient, token_ids: list[int]) -> dict:
    tr = tandem_repeat(token_ids)
    tail = tail_repeat(token_ids)
    last = token_ids[-200:]
    last_text = client.draft.detokenize(last)
    rl = repeated_line(last_text)
    looped = (tr["copies"] >= 3 and tr["tokens"] >= 48) or rl["count"] >= 3
    return {
        "tandem_repeat": tr,
        "tail_repeat": tail,
        "repeated_line_last200": rl,
        "looped": bool(looped),
        "ends_in_loop": bool(tail["copies"] >= 3 and tail["tokens"] >= 48),
    }


# -- the run ---------------------------------------------------------------------------


def run_chat(client: EdgeClient, chat: dict, condition: str, settings: dict, seed: int | None,
             max_tokens: int) -> dict:
    conv = client.conversation(max_tokens=max_tokens, seed=seed, **settings)
    answers: list[dict] = []
    token_ids: list[list[int]] = []
    texts: list[str] = []
    try:
        for turn, text in enumerate(chat["turns"], 1):
            t0 = time.perf_counter()
            final = conv.send(text).until_done()
            s = final.stats
            ids = list(final.token_ids)
            token_ids.append(ids)
            texts.append(final.text)
            answers.append({
                "turn": turn,
                "user": text,
                "finish_reason": s.finish_reason,
                "completion_tokens": s.completion_tokens,
                "prompt_tokens": s.prompt_tokens,
                "drafted": s.drafted,
                "accepted": s.accepted,
                "rounds": s.rounds,
                "acceptance_rate": s.acceptance_rate,
                "accepted_length_no_bonus": s.accepted_length,
                "elapsed_s": time.perf_counter() - t0,
                "sampler": s.sampler,
                **loop_flags(client, ids),
                "text": final.text[:400],
                "text_tail": final.text[-200:] if len(final.text) > 400 else None,
                "text_chars": len(final.text),
            })
            a = answers[-1]
            C.progress(f"    {chat['id']} {condition} seed={seed} turn {turn}: {a['finish_reason']} "
                       f"{a['completion_tokens']} tok, acc {a['acceptance_rate']:.2f}, "
                       f"looped {a['looped']} ({a['elapsed_s']:.0f} s)")
    finally:
        conv.close()
    return {
        "chat": chat["id"], "kind": chat["kind"], "condition": condition, "seed": seed,
        "turns": len(chat["turns"]), "answers": answers,
        "all_eos": all(a["finish_reason"] == "eos" for a in answers),
        "any_looped": any(a["looped"] for a in answers),
        "_token_ids": token_ids,  # not saved: for the identity check
        "_texts": texts,
    }


def identity_check(client: EdgeClient, label: str, messages: list[dict], max_tokens: int) -> dict:
    """Greedy speculative vs target-only on the same rendered prompt."""
    prompt = client.chat_template().render(messages, add_generation_prompt=True)
    tokens = client.tokenize(prompt)
    spec = client.generate(tokens, mode="greedy", drafting="fixed", draft_k=4, max_tokens=max_tokens).until_done()
    base = client.generate_target_only(tokens, mode="greedy", max_tokens=max_tokens).until_done()
    a, b = list(spec.token_ids), list(base.token_ids)
    div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    out = {
        "label": label,
        "prompt_tokens": len(tokens),
        "speculative_tokens": len(a),
        "target_only_tokens": len(b),
        "speculative_finish": spec.stats.finish_reason,
        "target_only_finish": base.stats.finish_reason,
        "speculative_acceptance": spec.stats.acceptance_rate,
        "identical": a == b,
        "first_divergence": div,
        "speculative_token_ids": a,
    }
    C.progress(f"  identity {label}: identical={out['identical']} ({len(a)} vs {len(b)} tokens)")
    return out


def main() -> None:
    parser = C.arguments(__doc__, threads=1, pair="qwen-coder", max_tokens=512, out=NAME)
    parser.add_argument("--chats", default="", help="chat ids to run (default all: palindrome + 10)")
    parser.add_argument("--palindrome-seeds", default="1,2,3")
    parser.add_argument("--seeds", default="1", help="seeds for the other chats under the defaults")
    parser.add_argument("--identity-chats", type=int, default=0,
                        help="also check greedy == target-only on the last turn of the first N other chats")
    parser.add_argument("--plot-only", action="store_true")
    args = C.parse(parser, machine=False)  # the machine line only for a measuring run, not --plot-only
    path = C.RESULTS_DIR / f"{args.out}.json"
    if args.plot_only:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return
    threads = args.threads or None
    C.print_machine()
    wanted = set(C.csv_list(args.chats))
    chats = [c for c in ALL_CHATS if not wanted or c["id"] in wanted]
    spec = get_pair(args.pair)
    t_load = time.perf_counter()
    client = EdgeClient(
        None,
        pair=args.pair,
        generation=GenerationConfig(max_tokens=args.max_tokens, draft_k=4, mode="greedy", drafting="fixed"),
        local_server=ServerConfig(port=0, max_sessions=2, max_context=4096, max_block=32, threads=threads),
    )
    t0 = time.perf_counter()
    runs: list[dict] = []
    identity: list[dict] = []
    payload: dict = {}
    try:
        info = client.server_info()
        load_s = time.perf_counter() - t_load
        recommended = client.draft.sampling_defaults()
        defaults = {"mode": "sample", **CHAT_SAMPLING, **recommended}
        greedy = {"mode": "greedy"}
        common = {"drafting": "fixed", "draft_k": 4}
        client.generate("Hello", max_tokens=8).until_done()  # warm-up

        def save(partial: bool) -> Path:
            payload.clear()
            payload.update({
                "settings": {
                    "pair": args.pair, "draft": spec.draft, "target": spec.target,
                    "target_model": info.target_model, "exact_numerics": info.exact_numerics,
                    "max_tokens": args.max_tokens, "drafting": "fixed", "draft_k": 4,
                    "defaults": defaults, "chat_sampling": CHAT_SAMPLING, "gguf_recommended": recommended,
                    "greedy": greedy, "palindrome_seeds": C.csv_list(args.palindrome_seeds, int),
                    "seeds": C.csv_list(args.seeds, int), "threads": args.threads, "load_s": load_s,
                    "loop_rule": "tandem repeat >= 3 copies covering >= 48 tokens, or a non-trivial line "
                                 ">= 3 times in the last 200 tokens",
                },
                "partial": partial,
                "wall_min": (time.perf_counter() - t0) / 60,
                "notes": [],
                "chats": [{k: v for k, v in c.items() if k != "turns"} | {"turns": c["turns"]} for c in chats],
                "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs],
                "identity": identity,
                "summary": summarize(runs, identity),
            })
            return C.write_result(args.out, payload)

        for chat in chats:
            C.progress(f"{chat['id']} ({(time.perf_counter() - t0) / 60:.1f} min)")
            seeds = C.csv_list(args.palindrome_seeds if chat["id"] == "palindrome" else args.seeds, int)
            g = run_chat(client, chat, "greedy", {**greedy, **common}, None, args.max_tokens)
            runs.append(g)
            for s in seeds:
                runs.append(run_chat(client, chat, "defaults", {**defaults, **common}, s, args.max_tokens))
            others_before = [c["id"] for c in chats if c["id"] != "palindrome"]
            if chat["id"] == "palindrome" or (chat["id"] in others_before[: args.identity_chats]):
                # Rebuild the greedy conversation's messages; check every turn for the palindrome,
                # the last one for the others.
                msgs: list[dict] = []
                turns = range(len(chat["turns"])) if chat["id"] == "palindrome" else [len(chat["turns"]) - 1]
                full = []
                for t, text in enumerate(chat["turns"]):
                    full.append({"role": "user", "content": text})
                    full.append({"role": "assistant", "content": g["_texts"][t]})
                for t in turns:
                    msgs = full[: 2 * t + 1]
                    identity.append(identity_check(client, f"{chat['id']} turn {t + 1}", msgs, args.max_tokens))
                    # the conversation's own greedy answer on the same turn, for reference
                    identity[-1]["conversation_answer_identical"] = (
                        identity[-1].pop("speculative_token_ids") == g["_token_ids"][t]
                    )
            save(partial=True)
        out = save(partial=False)
    finally:
        client.close()
    print_summary(payload)
    plot(json.loads(out.read_text()), out.with_suffix(".png"))
    print(out)


def summarize(runs: list[dict], identity: list[dict]) -> dict:
    out: dict = {}
    for cond in ("greedy", "defaults"):
        rs = [r for r in runs if r["condition"] == cond]
        if not rs:
            continue
        answers = [a for r in rs for a in r["answers"]]
        pal = [r for r in rs if r["chat"] == "palindrome"]
        others = [r for r in rs if r["chat"] != "palindrome"]
        drafted = sum(a["drafted"] for a in answers)
        out[cond] = {
            "chat_runs": len(rs),
            "chat_runs_all_eos": sum(r["all_eos"] for r in rs),
            "own_chats_all_eos": sum(r["all_eos"] for r in others),
            "own_chat_runs": len(others),
            "palindrome_runs": len(pal),
            "palindrome_all_eos": sum(r["all_eos"] for r in pal),
            "palindrome_followup_eos": sum(r["answers"][-1]["finish_reason"] == "eos" for r in pal),
            "answers": len(answers),
            "answers_eos": sum(a["finish_reason"] == "eos" for a in answers),
            "answers_length": sum(a["finish_reason"] == "length" for a in answers),
            "answers_looped": sum(a["looped"] for a in answers),
            "answers_ending_in_loop": sum(a["ends_in_loop"] for a in answers),
            "chat_runs_with_a_loop": sum(r["any_looped"] for r in rs),
            "mean_completion_tokens": sum(a["completion_tokens"] for a in answers) / len(answers),
            "acceptance_rate_pooled": C.ratio(sum(a["accepted"] for a in answers), drafted),
            "by_kind_all_eos": {k: f"{sum(r['all_eos'] for r in others if r['kind'] == k)}/"
                                   f"{sum(r['kind'] == k for r in others)}" for k in ("code", "prose")},
        }
    if identity:
        out["greedy_identical_to_target_only"] = f"{sum(i['identical'] for i in identity)}/{len(identity)}"
    return out


def print_summary(payload: dict) -> None:
    rows = []
    for r in payload["runs"]:
        for a in r["answers"]:
            rows.append([r["chat"], r["kind"], r["condition"], r["seed"], a["turn"], a["finish_reason"],
                         a["completion_tokens"], a["acceptance_rate"], a["looped"],
                         a["tandem_repeat"]["tokens"], a["repeated_line_last200"]["count"]])
    print(C.table(["chat", "kind", "condition", "seed", "turn", "finish", "tokens", "acceptance", "looped",
                   "tandem tokens", "line x"], rows))
    print(json.dumps(payload["summary"], indent=2))


def plot(payload: dict, path: Path) -> None:
    """Tokens per answer, greedy vs the defaults (each seed), the token limit drawn; EOS solid,
    limit hatched with a red edge; acceptance per answer below."""
    import matplotlib.patches as mpatches

    runs = payload["runs"]
    limit = payload["settings"]["max_tokens"]
    chats = list(dict.fromkeys(r["chat"] for r in runs))
    series = []  # (condition, seed) in a fixed order: greedy, then defaults by seed
    for r in runs:
        key = (r["condition"], r["seed"])
        if key not in series:
            series.append(key)
    series.sort(key=lambda k: (k[0] != "greedy", k[1] or 0))
    colors = {"greedy": ["#4477aa"], "defaults": ["#ee8866", "#ddaa33", "#bb5566", "#999933"]}
    answers = [(c, t) for c in chats for t in range(1, max(r["turns"] for r in runs if r["chat"] == c) + 1)]
    fig, (ax, acc) = C.subplots(1, nrows=2, width=max(10.0, 0.55 * len(answers) * 1.3), height=3.8)
    group_w = 0.84
    x_pos: list[float] = []
    labels: list[str] = []
    x = 0.0
    prev_chat = None
    for c, t in answers:
        if prev_chat is not None and c != prev_chat:
            x += 0.6  # gap between chats
        prev_chat = c
        present = [(cond, seed) for cond, seed in series
                   if any(r["chat"] == c and r["condition"] == cond and r["seed"] == seed for r in runs)]
        w = group_w / max(1, len(present))
        for j, (cond, seed) in enumerate(present):
            r = next(r for r in runs if r["chat"] == c and r["condition"] == cond and r["seed"] == seed)
            a = next((a for a in r["answers"] if a["turn"] == t), None)
            if a is None:
                continue
            i_def = [s for s in series if s[0] == "defaults"].index((cond, seed)) if cond == "defaults" else 0
            color = colors[cond][i_def % len(colors[cond])]
            hit = a["finish_reason"] != "eos"
            xi = x + (j - (len(present) - 1) / 2) * w
            ax.bar(xi, a["completion_tokens"], w, color=color, edgecolor="red" if hit else color,
                   hatch="///" if hit else None, linewidth=1.2 if hit else 0.5)
            if a["looped"]:
                ax.text(xi, a["completion_tokens"] + 8, "L", ha="center", fontsize=7, color="red")
            acc.bar(xi, a["acceptance_rate"], w, color=color)
        x_pos.append(x)
        labels.append(f"{c} {t}")
        x += 1.0
    ax.axhline(limit, color="red", ls="--", lw=1)
    ax.text(1.002, limit, f"limit\n{limit}", color="red", fontsize=8, va="center", ha="left",
            transform=ax.get_yaxis_transform())
    s = payload["summary"]
    d, g = s.get("defaults", {}), s.get("greedy", {})
    ax.set_title(
        f"{payload['settings']['pair']}: tokens per answer, max {limit} "
        f"(chats all-EOS: defaults {d.get('chat_runs_all_eos', '-')}/{d.get('chat_runs', '-')}, "
        f"greedy {g.get('chat_runs_all_eos', '-')}/{g.get('chat_runs', '-')}; "
        f"greedy = target-only {s.get('greedy_identical_to_target_only', '-')})", fontsize=9)
    ax.set_ylabel("completion tokens")
    ax.set_ylim(0, limit * 1.3)
    handles = [mpatches.Patch(color=colors[cond][([q for q in series if q[0] == 'defaults'].index((cond, seed))
                                                  if cond == 'defaults' else 0) % 4],
                              label=f"{cond}" + (f" seed {seed}" if seed is not None else ""))
               for cond, seed in series]
    handles.append(mpatches.Patch(facecolor="white", edgecolor="red", hatch="///", label="hit the limit"))
    handles.append(mpatches.Patch(color="white", label="L: loop flagged"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", ncol=len(handles))
    for a_ in (ax, acc):
        a_.set_xticks(x_pos, labels, rotation=60, ha="right", fontsize=7)
    acc.set_ylim(0, 1)
    acc.set_ylabel("acceptance rate (K=4)")
    acc.set_title("acceptance per answer", fontsize=9)
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
