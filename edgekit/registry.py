"""Policies by name: the one list of each kind, from which the configuration checks a name, the
command line offers its choices and the docs draw their tables.

- `SCHEDULERS`: which work the verifier's engine runs next (`ServerConfig.policy`, `edgekit serve
  --policy`); each builds a `Scheduler` from the verifier's time estimator and its config.
- `BUDGET_POLICIES`: the draft budgets a verifier assigns (`ServerConfig.budgets`, `--budgets`);
  each builds a `BudgetPolicy` ("none": no budgets).
- `DRAFTING`: how long each block is (`GenerationConfig.drafting`, `--drafting`); each builds a
  `Controller` from a `ControllerFactory`, the config and the session's link policy.
- `TRANSPORTS`: how a device reaches a verifier, by its URL's scheme (`connect`, every `--verifier`);
  each builds a `VerifierTransport` from the URL, a `ClientConfig` and the draft's tokenizer
  (`edgekit.transport._schemes` says the contract).
- `ENGINES`: what runs the target behind `edgekit serve`, by kind (`ServerConfig.engine`,
  `--engine`); each builds an `Engine` from the `--model` text, the `ServerConfig` and a name.

A policy is a module of its own and one line here: its name, where its builder is ("module:name",
loaded on first use, so that naming one imports nothing), and a line saying what it does. A
package installed beside edgekit adds one with an entry point in the registry's group
(`edgekit.schedulers`, `edgekit.budget_policies`, `edgekit.drafting`, `edgekit.transports`,
`edgekit.engines`), and a program with
`register`:

>>> from edgekit.registry import SCHEDULERS
>>> SCHEDULERS.register("lifo", "mypackage.lifo:build", "the newest work first")
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from .errors import ConfigError

__all__ = ["BUDGET_POLICIES", "DRAFTING", "ENGINES", "SCHEDULERS", "TRANSPORTS", "Entry", "Registry"]


@dataclass(frozen=True)
class Entry:
    """A policy's name, its builder (an object, or "module:name" to import on first use; None for a
    name that builds nothing, as budgets "none") and what it does, in a line."""

    name: str
    target: str | Callable[..., Any] | None
    doc: str = ""


class Registry:
    """The policies of one kind by name (see this module): `setting` is the config field that
    names one, `group` the entry-point group a package adds its own in."""

    def __init__(self, kind: str, setting: str, group: str, entries: Sequence[Entry]) -> None:
        self.kind = kind
        self.setting = setting
        self.group = group
        self._entries = {e.name: e for e in entries}
        self._loaded: dict[str, Any] = {}
        self._discovered = False
        self._lock = threading.Lock()

    def register(self, name: str, target: str | Callable[..., Any], doc: str = "") -> None:
        """Adds a policy under `name`; a name taken already is refused (ConfigError)."""
        self._discover()
        with self._lock:
            if not name or name in self._entries:
                raise ConfigError(f"a {self.kind} named {name!r} is registered already" if name
                                  else f"a {self.kind} needs a name")
            self._entries[name] = Entry(name, target, doc)

    def names(self) -> tuple[str, ...]:
        self._discover()
        with self._lock:
            return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def entries(self) -> tuple[Entry, ...]:
        self._discover()
        with self._lock:
            return tuple(self._entries.values())

    def check(self, name: str) -> None:
        """Refuses a name no policy has, naming the ones there are (ConfigError)."""
        if name not in self:
            raise ConfigError(f"{self.setting} must be one of {', '.join(self.names())}, got {name!r}")

    def load(self, name: str) -> Any:
        """The builder registered as `name` (imported on first use)."""
        self.check(name)
        with self._lock:
            if name not in self._loaded:
                target = self._entries[name].target
                if isinstance(target, str):
                    module, _, attr = target.partition(":")
                    target = getattr(importlib.import_module(module), attr)
                self._loaded[name] = target
            return self._loaded[name]

    def metavar(self) -> str:
        """The names as a command line shows an option's choices: `fcfs|wisp`."""
        return "|".join(self.names())

    def help(self, lead: str) -> str:
        """`lead`, then each name and what it does: a command-line option's help."""
        return f"{lead}: " + "; ".join(f"{e.name} ({e.doc})" if e.doc else e.name for e in self.entries()) + "."

    def _discover(self) -> None:
        """The policies installed packages add by entry point, once."""
        if self._discovered:
            return
        found = entry_points(group=self.group)
        with self._lock:
            if self._discovered:
                return
            for ep in found:
                source = ep.dist.name if ep.dist is not None else ep.module
                self._entries.setdefault(ep.name, Entry(ep.name, ep.value, f"from {source}"))
            self._discovered = True


SCHEDULERS = Registry("scheduler", "policy", "edgekit.schedulers", [
    Entry("fcfs", "edgekit.verifier.scheduler._fcfs:build", "arrival order, SLED's verifier"),
    Entry("wisp", "edgekit.verifier.scheduler._wisp:build",
          "token-speed SLOs: deadlines first, then expected tokens per ms; WISP Algorithm 1, with the "
          "verification-time estimator"),
])

BUDGET_POLICIES = Registry("budget policy", "budgets", "edgekit.budget_policies", [
    Entry("none", None, "devices choose"),
    Entry("goodspeed", "edgekit.verifier._budgets:GoodSpeed",
          "GOODSPEED's gradient scheduling: proportional fairness of goodput"),
    Entry("fixed", "edgekit.verifier._budgets:FixedShare", "C/N each"),
    Entry("random", "edgekit.verifier._budgets:RandomShare", "a random split of C"),
])

DRAFTING = Registry("drafting policy", "drafting", "edgekit.drafting", [
    Entry("auto", "edgekit.drafting._factory:build_auto",
          "the shipped predictor where there is one, else fixed; plain decoding while it is faster"),
    Entry("fixed", "edgekit.drafting._factory:build_fixed", "draft_k tokens a block"),
    Entry("predictor", "edgekit.drafting._factory:build_predictor",
          "stop at the first rejection an ONNX predictor foresees, as WISP does"),
    Entry("p-min", "edgekit.drafting._factory:build_p_min",
          "stop where the draft's top probability falls below p_min"),
    Entry("latency", "edgekit.drafting._factory:build_latency",
          "the window the latency model expects fastest on the measured link"),
])

TRANSPORTS = Registry("transport", "the verifier URL's scheme", "edgekit.transports", [
    Entry("grpc", "edgekit.transport._schemes:grpc", "an edgekit verifier (edgekit serve), plain gRPC; also a bare "
          "HOST:PORT"),
    Entry("grpcs", "edgekit.transport._schemes:grpcs", "an edgekit verifier over TLS"),
    Entry("openai+http", "edgekit.transport._schemes:openai",
          "an OpenAI-compatible completions server with prompt logprobs (llama-cpp-python, vLLM)"),
    Entry("openai+https", "edgekit.transport._schemes:openai", "the same over TLS"),
    Entry("sglang+http", "edgekit.transport._schemes:sglang", "SGLang's native /generate"),
    Entry("sglang+https", "edgekit.transport._schemes:sglang", "the same over TLS"),
    Entry("trtllm+http", "edgekit.transport._schemes:trtllm",
          "TensorRT-LLM's tensorrt_llm model on Triton (?model=NAME&max_draft_len=N): greedy"),
    Entry("trtllm+https", "edgekit.transport._schemes:trtllm", "the same over TLS"),
])

ENGINES = Registry("engine", "engine", "edgekit.engines", [
    Entry("llama", "edgekit.verifier._server:llama_engine",
          "a GGUF target on llama.cpp (CPU, or layers on a GPU with --gpu-layers)"),
])
