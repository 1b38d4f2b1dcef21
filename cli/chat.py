"""`edgekit chat`: an interactive terminal chat over speculative decoding."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import typer

from ._common import (
    _DRAFT,
    _DRAFTING,
    _FREQUENCY_PENALTY,
    _INSECURE,
    _MAX_WINDOW,
    _MIN_P,
    _ON_DISCONNECT,
    _P_MIN,
    _PREDICTOR,
    _PREDICTOR_SCHEDULE,
    _PRESENCE_PENALTY,
    _PROACTIVE,
    _REPEAT_LAST_N,
    _REPEAT_PENALTY,
    _RETRY_FOR,
    _SEMANTIC_THRESHOLD,
    _SLO_CLASS,
    _TARGET,
    _TARGET_SPEED,
    _TOKEN,
    _TOP_K,
    _TOP_P,
    _UPLOAD,
    _YES,
    MODE_HELP,
    PAIR_HELP,
    VERIFIER_HELP,
    sampler_options,
    semantic_summary,
    timeout_option,
    upload_for,
)
from .generate import Mode

if TYPE_CHECKING:  # the command imports them when it runs: `edgekit --help` stays fast
    from rich.console import Console, Group

    from edgekit import Conversation, EdgeClient, GenerationConfig, GenerationStream

    from ._history import History

HELP_TEXT = """\
Type a message and press Enter. Commands:
  /help                 this text
  /stats                acceptance, accepted length, rounds, speed, link
  /set KEY VALUE        k (draft window), drafting (auto|fixed|predictor|p-min|latency), max_window,
                        p_min, upload (tokens|fh|sh|auto|rtt), mode (greedy|sample|semantic),
                        temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                        presence_penalty, repeat_last_n, max_tokens, seed
  /clear                start a new conversation (keeps the system prompt)
  /exit                 leave (or Ctrl-D); Ctrl-C stops the current answer"""

_SET_KEYS = {"k": "draft_k", "draft_k": "draft_k", "temperature": "temperature", "t": "temperature", "mode": "mode",
             "max_tokens": "max_tokens", "seed": "seed", "drafting": "drafting", "max_window": "max_window",
             "p_min": "p_min", "upload": "upload", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
             "repeat_penalty": "repetition_penalty", "repetition_penalty": "repetition_penalty",
             "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
             "repeat_last_n": "penalty_last_n"}
_TEXT_KEYS = ("mode", "drafting", "upload")
_INT_KEYS = ("draft_k", "max_tokens", "seed", "max_window", "top_k", "penalty_last_n")

# How chat samples unless told otherwise (as ollama, llama.cpp's server and LM Studio do: small models
# loop under greedy decoding); a setting the model's GGUF recommends (general.sampling.*) wins.
CHAT_SAMPLING = {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1}


class _MarkdownAnswer:
    """The answer rendered as Markdown while it streams (code blocks highlighted), redrawn in
    place by rich's Live display; provisional tokens (drafted while no verifier answers) are
    shown dimmed after it and dropped when output replaces them. On a terminal only."""

    def __init__(self, out: Console) -> None:
        from rich.live import Live

        self.out = out
        self.text = ""
        self.ahead = ""
        self._live = Live(console=out, refresh_per_second=8, vertical_overflow="visible", transient=False)

    def __enter__(self) -> _MarkdownAnswer:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ahead = ""
        self._live.update(self._renderable(), refresh=True)
        self._live.stop()

    def add(self, text: str) -> None:
        self.text += text
        self.ahead = ""
        self._live.update(self._renderable())

    def provisional(self, text: str) -> None:
        self.ahead = text
        self._live.update(self._renderable())

    def _renderable(self) -> Group:
        from rich.console import Group
        from rich.markdown import Markdown
        from rich.text import Text

        parts: list = [Markdown(self.text, code_theme="monokai")]
        if self.ahead:
            parts.append(Text(self.ahead, style="dim"))
        return Group(*parts)


class _ProvisionalText:
    """Provisional tokens shown dimmed after the answer, taken back when output replaces them.

    It keeps the cursor's column from what the answer printed, so it can move back over
    wrapped lines (the terminal may have scrolled, so saving the cursor would not do)."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.enabled = out.is_terminal
        self.column = 0
        self._shown: tuple[int, int] | None = None  # rows below, and the column it began at

    def printed(self, text: str) -> None:
        """Follows the cursor over text the answer printed."""
        self.column = self._advance(self.column, text)[1]

    def _advance(self, column: int, text: str) -> tuple[int, int]:
        from rich.cells import cell_len

        width, rows = max(1, self.out.width), 0
        for ch in text:
            if ch == "\n":
                rows, column = rows + 1, 0
                continue
            w = cell_len(ch)
            if column + w > width:  # the terminal wraps before the character
                rows, column = rows + 1, 0
            column += w
        return rows, column

    def show(self, text: str) -> None:
        self.clear()
        if not (self.enabled and text):
            return
        self.out.file.write(f"\x1b[2m{text}\x1b[0m")
        self.out.file.flush()
        self._shown = (self._advance(self.column, text)[0], self.column)

    def clear(self) -> None:
        if self._shown is None:
            return
        rows, column = self._shown
        self.out.file.write("\r" + (f"\x1b[{rows}A" if rows else "") + f"\x1b[{column + 1}G\x1b[J")
        self.out.file.flush()
        self._shown = None


class _Interrupt:
    """First Ctrl-C during an answer stops it at the next round; a second one aborts."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def armed(self) -> Iterator[_Interrupt]:
        self.requested = False

        def handler(signum: int, frame: object) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True

        try:
            previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread (e.g. under a test runner): no handler
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


def chat(
    draft: str | None = _DRAFT,
    target: str | None = _TARGET,
    yes: bool = _YES,
    pair: str | None = typer.Option(None, "--pair", help=PAIR_HELP),
    verifier: str | None = typer.Option(None, "--verifier", help=VERIFIER_HELP),
    system: str | None = typer.Option(None, "--system", "-s", help="System prompt."),
    prompt: str | None = typer.Option(None, "--prompt", "-p", help="Answer this one message and exit."),
    json_out: bool = typer.Option(
        False, "--json", help="Machine-readable output only: one JSON object per answer; diagnostics on stderr."
    ),
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", min=1, help="Most tokens per answer."),
    mode: Mode | None = typer.Option(
        None, "--mode", help=MODE_HELP + " Default: sample, with temperature 0.7, top-p 0.9, min-p 0.05 and repeat "
        "penalty 1.1 unless the model's GGUF recommends its own."
    ),
    greedy: bool = typer.Option(
        False, "--greedy",
        help="Decode greedily (the target's exact argmax, token-identical to it alone): --mode greedy.",
    ),
    semantic_threshold: float | None = _SEMANTIC_THRESHOLD,
    temperature: float | None = typer.Option(
        None, "--temperature", "-t", help="Sampling temperature (mode sample; default 0.7 or the GGUF's)."
    ),
    top_k: int | None = _TOP_K,
    top_p: float | None = _TOP_P,
    min_p: float | None = _MIN_P,
    repeat_penalty: float | None = _REPEAT_PENALTY,
    frequency_penalty: float | None = _FREQUENCY_PENALTY,
    presence_penalty: float | None = _PRESENCE_PENALTY,
    repeat_last_n: int | None = _REPEAT_LAST_N,
    draft_k: int = typer.Option(4, "--draft-k", "-k", min=1, max=64, help="Draft window K: tokens drafted per round."),
    drafting: str = _DRAFTING,
    predictor: str | None = _PREDICTOR,
    predictor_schedule: bool = _PREDICTOR_SCHEDULE,
    max_window: int = _MAX_WINDOW,
    p_min: float = _P_MIN,
    upload: str | None = _UPLOAD,
    slo_class: str | None = _SLO_CLASS,
    target_speed: float | None = _TARGET_SPEED,
    seed: int | None = typer.Option(None, "--seed", help="Seed for sampling (reproducible answers)."),
    history: bool = typer.Option(
        True, "--history/--no-history",
        help="Keep the chat in the per-user data directory (EDGEKIT_NO_HISTORY=1 also turns it off)."
    ),
    token: str | None = _TOKEN,
    insecure: bool = _INSECURE,
    timeout: float = timeout_option(60.0),
    retry_for: float | None = _RETRY_FOR,
    on_disconnect: str | None = _ON_DISCONNECT,
    proactive: bool = _PROACTIVE,
    plain: bool = typer.Option(
        False, "--plain", help="Print answers as raw text; by default a terminal shows them rendered as Markdown "
        "(code blocks highlighted) while they stream."
    ),
) -> None:
    """Chat with the pair's target model, drafted on this device (one session, KV reused across turns)."""
    from rich.console import Console

    from edgekit import GenerationConfig
    from edgekit.config import Mode as ModeName
    from edgekit.config import Upload

    from . import _connect
    from ._history import History

    chosen = "greedy" if greedy else mode.value if mode is not None else "sample"
    if greedy and mode not in (None, Mode.greedy):
        raise typer.BadParameter(f"--greedy and --mode {mode.value} disagree", param_hint="--greedy")
    explicit = sampler_options(top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n)
    if temperature is not None:
        explicit["temperature"] = temperature
    gen = GenerationConfig(
        max_tokens=max_tokens, mode=cast(ModeName, chosen), draft_k=draft_k, seed=seed,
        drafting=drafting, predictor=predictor, max_window=max_window, p_min=p_min,
        predictor_schedule=predictor_schedule,
        slo_class=slo_class, target_speed=target_speed, proactive=proactive,
        upload=cast(Upload, upload_for(upload, chosen)), semantic_threshold=semantic_threshold,
        **({**CHAT_SAMPLING, **explicit} if chosen == "sample" else explicit),
    )
    # With --json, stdout carries only JSON lines; everything for people goes to stderr.
    out = Console(highlight=False, soft_wrap=True, stderr=json_out)
    with _connect.build_client(
        pair=pair if verifier else pair or "qwen-coder", verifier=verifier, timeout=timeout, token=token,
        insecure=insecure,
        draft=draft, target=target, yes=yes,
        generation=gen, retry_for=retry_for, on_disconnect=on_disconnect,
    ) as client:
        pair = client.pair
        log = History(history, pair)
        recommended = client.recommended_sampling() if chosen == "sample" else {}
        conv = client.conversation(system=system, **{**recommended, **explicit})
        session = _ChatSession(client, conv, out, log, json_out, markdown=not plain)
        try:
            if prompt is not None:
                session.answer(prompt)
            else:
                session.loop(pair, interactive=sys.stdin.isatty())
        finally:
            conv.close()


class _ChatSession:
    def __init__(
        self, client: EdgeClient, conv: Conversation, out: Console, log: History, json_out: bool, *,
        markdown: bool = False,
    ) -> None:
        self.client = client
        self.conv = conv
        self.out = out
        self.log = log
        self.json_out = json_out
        self.markdown = markdown and out.is_terminal  # rendered only where a terminal shows it
        self.interrupt = _Interrupt()

    # -- one answer ---------------------------------------------------------------------

    def answer(self, text: str) -> None:
        from rich.markup import escape

        from edgekit import Provisional, Resumed, TextDelta

        self.log.add("user", text)
        stream = self.conv.send(text)
        stopped = False
        if self.markdown and not self.json_out:
            with self.interrupt.armed() as interrupt, stream, _MarkdownAnswer(self.out) as shown:
                for event in stream:
                    if isinstance(event, Provisional):
                        shown.provisional(event.text)
                    elif isinstance(event, TextDelta):
                        shown.add(event.text)
                    elif isinstance(event, Resumed):
                        shown.add(f" *[verifier lost for {event.outage_ms / 1e3:.1f} s; resumed]* ")
                    if interrupt.requested:
                        stopped = True
                        break
            self._finish(stream, stopped)
            return
        ahead = _ProvisionalText(self.out)
        with self.interrupt.armed() as interrupt, stream:
            for event in stream:
                if self.json_out:
                    pass
                elif isinstance(event, Provisional):
                    ahead.show(event.text)  # drafted while no verifier answers: dimmed, taken back later
                elif isinstance(event, TextDelta):
                    ahead.clear()
                    self.out.print(event.text, end="", markup=False)
                    ahead.printed(event.text)
                elif isinstance(event, Resumed):
                    ahead.clear()
                    note = f" [verifier lost for {event.outage_ms / 1e3:.1f} s; resumed] "
                    self.out.print(f"[dim]{escape(note)}[/dim]", end="")
                    ahead.printed(note)
                if interrupt.requested:
                    stopped = True
                    break
            ahead.clear()
        self._finish(stream, stopped)

    def _finish(self, stream: GenerationStream, stopped: bool) -> None:
        """The answer into the history, then its JSON line or its stats line."""
        reply = self.conv.messages[-1]["content"]
        self.log.add("assistant", reply)
        stats = stream.final.stats if stream.final else None
        if self.json_out:
            sampler = replace(self.client.generation, **self.conv.overrides).sampler().describe()
            payload: dict = {"reply": reply, "stopped": stopped, "sampler": sampler}
            if stream.final is not None:
                payload.update(token_ids=list(stream.final.token_ids), metrics=stream.final.stats.to_dict())
            sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
            sys.stdout.flush()
            return
        self.out.print()
        if stopped:
            self.out.print("[dim]\\[stopped][/dim]")  # escaped: rich would read [stopped] as a tag
        elif stats is not None:
            self.out.print(
                f"[dim]\\[{stats.completion_tokens} tokens · {stats.tokens_per_second:.1f} tok/s · acceptance "
                f"{stats.acceptance_rate:.2f} · AAL {stats.accepted_length:.2f} · {stats.rounds} rounds"
                f"{semantic_summary(stats, sep=' · ')} · finish: {stats.finish_reason}][/dim]"
            )

    # -- the interactive loop -----------------------------------------------------------------

    def loop(self, pair: str, *, interactive: bool) -> None:
        """Messages and /commands, one per line, until /exit or end of input."""
        if interactive:
            info = self.client.server_info()
            self.out.print(
                f"[bold]edgekit chat[/bold] · {pair}: draft [cyan]{self.client.draft.name}[/cyan] on this device, "
                f"target [cyan]{info.target_model}[/cyan] at {self.client.transport.address}"
            )
            self.out.print(f"[dim]{_sampling_line(replace(self.client.generation, **self.conv.overrides))}[/dim]")
            self.out.print("[dim]/help for commands · Ctrl-C stops an answer · Ctrl-D exits[/dim]")
            self.log.load_input_history()
        try:
            while True:
                try:
                    line = input("\n› ") if interactive else sys.stdin.readline()
                except KeyboardInterrupt:
                    self.out.print("\n[dim](Ctrl-D or /exit to leave)[/dim]")
                    continue
                except EOFError:
                    self.out.print()
                    return
                if not interactive and not line:
                    return  # end of input
                line = line.strip()
                if not line:
                    continue
                if line.startswith("/"):
                    if not self.command(line):
                        return
                    continue
                try:
                    self.answer(line)
                except KeyboardInterrupt:
                    # A second Ctrl-C aborted mid-round: the session may be out of step; start afresh.
                    self.conv.close()
                    self.out.print("\n[dim][aborted; the next message starts a new verifier session][/dim]")
        finally:
            if interactive:
                self.log.save_input_history()

    def command(self, line: str) -> bool:
        from edgekit import ConfigError

        name, *args = line[1:].split()
        name = name.lower()
        if name in ("exit", "quit", "q"):
            return False
        if name == "help":
            self.out.print(HELP_TEXT, markup=False)
        elif name == "clear":
            self.conv.clear()
            self.out.print("[dim]conversation cleared[/dim]")
        elif name == "stats":
            self.stats()
        elif name == "set":
            if len(args) != 2 or args[0].lower() not in _SET_KEYS:
                self.out.print(
                    f"usage: /set KEY VALUE with KEY one of {', '.join(sorted(set(_SET_KEYS)))}", markup=False
                )
                return True
            key, raw = _SET_KEYS[args[0].lower()], args[1]
            value: Any
            try:
                value = (
                    raw if key in _TEXT_KEYS else int(raw) if key in _INT_KEYS else float(raw)
                )
                current = replace(self.client.generation, **self.conv.overrides)
                replace(current, **{key: value})  # validates
                self.conv.configure(**{key: value})  # refuses what the verifier cannot do
            except (ValueError, ConfigError) as exc:
                self.out.print(f"[red]cannot set {key}: {exc}[/red]")
                return True
            self.out.print(f"[dim]{key} = {value}[/dim]")
        else:
            self.out.print(f"unknown command /{name}; /help lists them", markup=False)
        return True

    def stats(self) -> None:
        from rich.table import Table

        from edgekit import EdgekitError

        turns = self.conv.totals
        if not turns:
            self.out.print("[dim]no answers yet[/dim]")
        else:
            last = turns[-1]
            drafted = sum(t.drafted for t in turns)
            accepted = sum(t.accepted for t in turns)
            rounds = sum(t.rounds for t in turns)
            tokens = sum(t.completion_tokens for t in turns)
            seconds = sum(t.elapsed_s for t in turns)
            table = Table(show_header=True, header_style="bold")
            for col in ("", "last answer", "conversation"):
                table.add_column(col)
            table.add_row("tokens", str(last.completion_tokens), str(tokens))
            table.add_row("rounds", str(last.rounds), str(rounds))
            table.add_row(
                "acceptance rate", f"{last.acceptance_rate:.3f}", f"{accepted / drafted:.3f}" if drafted else "-"
            )
            table.add_row(
                "accepted length (AAL, no bonus)", f"{last.accepted_length:.2f}",
                f"{accepted / rounds:.2f}" if rounds else "-"
            )
            table.add_row(
                "target passes per token", f"{last.target_passes_per_token:.3f}",
                f"{rounds / tokens:.3f}" if tokens else "-"
            )
            if last.mode == "semantic":
                table.add_row(
                    f"mismatches accepted (semantic: head {last.semantic_head}, "
                    f"threshold {last.semantic_threshold:.3f})",
                    str(last.server.semantic_accepted), str(sum(t.server.semantic_accepted for t in turns)),
                )
            table.add_row(
                "wasted draft tokens", str(last.wasted_draft_tokens), str(sum(t.wasted_draft_tokens for t in turns))
            )
            table.add_row(
                "tokens per second", f"{last.tokens_per_second:.1f}", f"{tokens / seconds:.1f}" if seconds else "-"
            )
            ttft = last.time_to_first_token_ms
            table.add_row("time to first token", f"{ttft:.0f} ms" if ttft is not None else "-", "")
            table.add_row("drafting per token", f"{last.draft_ms_per_token:.1f} ms", "")
            if last.device:
                d = last.device
                busy = f"{d['cpu_percent']:.0f}% CPU" if d.get("cpu_percent") is not None else "CPU not reported"
                heat = f" · {d['temperature_c']:.0f} C" if d.get("temperature_c") is not None else ""
                held = " · THROTTLED" if d.get("throttled") else ""
                table.add_row(
                    "device", f"{busy} · {d['process_rss_mb']:.0f} MB resident · "
                    f"{d['memory_available_mb']:.0f} MB free{heat}{held}", ""
                )
            self.out.print(table)
        try:
            measured = self.client.probe_link(pings=5, tries=1, payload_bytes=64 * 1024).link
        except EdgekitError as exc:
            self.out.print(f"[red]link: {exc}[/red]")
            return
        link = (
            f"link: {self.client.transport.address} · RTT {measured.rtt_ms:.2f} ms "
            f"(jitter {measured.rtt_jitter_ms:.2f}) · "
            f"up {measured.uplink_mbps:.0f} / down {measured.downlink_mbps:.0f} Mbit/s · loss {measured.loss_rate:.1%}"
        )
        info = self.client.server_info()
        link += f" · numerics {'exact' if info.exact_numerics else 'fast'}"
        self.out.print(f"[dim]{link}[/dim]")


def _sampling_line(gen: GenerationConfig) -> str:
    """How the answers are decoded, in words: 'greedy' or the sampler's settings."""
    if gen.mode != "sample":
        extra = ", ".join(f"{k} {v}" for k, v in gen.sampler().describe().items() if k != "temperature")
        return f"decoding: {gen.mode}" + (f" ({extra})" if extra else "")
    settings = ", ".join(f"{k} {v}" for k, v in gen.sampler().describe().items())
    return f"sampling: {settings} (--greedy for the target's exact argmax)"
