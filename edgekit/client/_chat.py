"""Chat: templates from GGUF metadata, and conversations that keep one session.

A conversation stays one verifier session: each new user turn is appended to
the committed tokens (ExtendSession), so neither the verifier nor the draft
model re-reads the history. What is appended is the text the template writes
after the assistant's reply (less the end-of-turn token the model already
produced) and then the new user turn, found by rendering the conversation with
and without it: chat templates render messages one after another, so the
shorter rendering is a prefix of the longer.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ..errors import ConfigError, EdgekitError, SessionNotFoundError
from ..runtime import DraftModel
from ._events import Event, FinalStats, TextDelta
from ._session import SpeculativeSession
from ._stats import GenerationStats
from ._stream import GenerationStream

__all__ = ["ChatClient", "ChatTemplate", "Conversation"]


class ChatClient(Protocol):
    """What a conversation asks of the client that made it (`EdgeClient` is one): the client
    makes conversations, a conversation only calls it."""

    @property
    def draft(self) -> DraftModel: ...

    def chat_template(self) -> ChatTemplate: ...

    def tokenize(self, prompt: str | Sequence[int], *, special: bool = True) -> list[int]: ...

    def token_text(self, token: int) -> str: ...

    def session(self, **overrides: Any) -> SpeculativeSession: ...

# For models without a template (base models such as gemma-3-270m): plain text turns.
PLAIN_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}\n\n"
    "{% elif m.role == 'user' %}User: {{ m.content }}\n"
    "{% else %}Assistant:{{ m.content }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
_SENTINEL = "\x00edgekit-reply\x00"


class ChatTemplate:
    """A Jinja chat template, rendered in a sandbox as Hugging Face templates expect."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals.update(
            raise_exception=raise_exception,
            strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt),
        )
        self.source = source or PLAIN_TEMPLATE
        self.is_plain = source is None
        try:
            self._template = env.from_string(self.source)
        except TemplateError as exc:
            raise ConfigError(f"the model's chat template does not parse: {exc}") from exc
        self._specials = {"bos_token": bos_token, "eos_token": eos_token}

    def render(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
        from jinja2.exceptions import TemplateError

        try:
            return self._template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **self._specials
            )
        except TemplateError as exc:
            raise ConfigError(f"the chat template refused these messages: {exc}") from exc

    def reply_suffix(self, history: Sequence[dict]) -> str:
        """What the template writes after an assistant reply's content (e.g. '<|im_end|>\\n')."""
        text = self.render([*history, {"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        return text[text.index(_SENTINEL) + len(_SENTINEL) :]

    def next_turn(self, history: Sequence[dict], user: dict) -> str:
        """The text after `history` (closed, ending with a reply) that opens the reply to `user`."""
        before = self.render(history, add_generation_prompt=False)
        after = self.render([*history, user], add_generation_prompt=True)
        if not after.startswith(before):
            raise EdgekitError("this chat template re-renders earlier turns; the conversation cannot be extended")
        return after[len(before) :]


class Conversation:
    """A multi-turn chat on one verifier session; `send` streams the reply.

    >>> chat = client.conversation(system="Answer briefly.")
    >>> print(chat.send("What is a monad?").text())
    >>> print(chat.send("An example in Python?").text())   # reuses both KV caches
    """

    def __init__(self, client: ChatClient, *, system: str | None = None, **overrides: Any) -> None:
        self.client = client
        self.overrides = dict(overrides)
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.last_stats: GenerationStats | None = None
        self.totals: list[GenerationStats] = []
        self._template = client.chat_template()
        self._session: SpeculativeSession | None = None
        self._closing = ""  # template text still owed after the last reply

    @property
    def session(self) -> SpeculativeSession | None:
        return self._session

    def configure(self, **overrides: Any) -> None:
        """Changes generation settings from the next turn on; a new mode, sampler setting
        (temperature, top_p, penalties, ...) or seed needs a new verifier session, the rest
        does not."""
        if self._session is not None and not self._session.reconfigure(**overrides):  # may refuse: nothing changes
            self._session.close()
            self._session = None
        self.overrides.update(overrides)

    def send(self, text: str) -> GenerationStream:
        user = {"role": "user", "content": text}

        def events() -> Iterator[Event]:
            session, prefill_ms = self._prepare(user)
            stream = session.stream(prefill_ms=prefill_ms)
            progress, reply, final = session.progress, [], None
            try:
                for ev in stream:
                    if isinstance(ev, TextDelta):
                        reply.append(ev.text)
                    elif isinstance(ev, FinalStats):
                        final = ev.stats
                    yield ev
            finally:
                # A reply stopped early has no FinalStats: its figures are those counted so far.
                final = final or (progress.stopped() if progress is not None else None)
                if final is not None:
                    self.last_stats = final
                    self.totals.append(final)
                # Also on interruption between rounds: the session holds what was shown.
                self._close_turn(user, "".join(reply), session)
                if progress is not None and len(progress.token_ids) < len(progress.produced):
                    # A stop string cut the reply (or text held back at a stop's possible start was
                    # never shown): the session's context holds tokens the reply does not. The next
                    # turn opens a session on the history as shown, which the verifier prefills.
                    self.close()

        return GenerationStream(events())

    def _prepare(self, user: dict) -> tuple[SpeculativeSession, float]:
        if self._session is not None:
            text = self._closing + self._template.next_turn(self.messages, user)
            try:
                return self._session, self._session.extend(self.client.tokenize(text, special=False))
            except SessionNotFoundError:
                self._session.close()  # its draft slot back; the verifier has forgotten it already
                self._session = None  # evicted while idle: start again from the rendered history
        self._session = self.client.session(**self.overrides)
        prompt = self._template.render([*self.messages, user], add_generation_prompt=True)
        return self._session, self._session.open(self.client.tokenize(prompt))

    def _close_turn(self, user: dict, reply: str, session: SpeculativeSession) -> None:
        self.messages += [user, {"role": "assistant", "content": reply}]
        closing = self._template.reply_suffix(self.messages[:-1])
        last = session.tokens[-1] if session.tokens else None
        if last is not None and self.client.draft.is_eog(last):
            produced = self.client.token_text(last)
            if closing.startswith(produced):
                closing = closing[len(produced) :]
        self._closing = closing

    def clear(self) -> None:
        """Forgets the turns (not the system prompt) and ends the session."""
        self.close()
        self.messages = [m for m in self.messages if m["role"] == "system"]
        self._closing = ""

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> Conversation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
