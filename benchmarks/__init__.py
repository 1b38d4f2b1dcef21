"""edgekit's benchmarks, one tool: `python -m benchmarks NAME [ARGS...]` runs one with its own command
line, `python -m benchmarks --list` names them all with what each measures and its results page.

A benchmark is a module of this package (`benchmarks/NAME.py`, `benchmarks/gpu/NAME.py` as
`gpu.NAME`) with a `main()` that reads `sys.argv` through the harness (`C.parse`); `BENCHMARKS`
below is the one list of them, which benchmarks/README.md's table and docs/results/ follow
(tests/unit/benchmarks/test_benchmarks_package.py checks both). What several benchmarks share is a
library beside them: `harness` (the command line, the machine, results, plots, processes) and `rigs`
(the fleet simulator, the load generator, the peers, the proxies, link emulation, vLLM). A benchmark
imports those, never another benchmark's internals: one that runs another runs it by name (`run`),
and `figures` redraws the others' figures with their `plot`. Nothing here imports a benchmark until
it is run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its NAME (`python -m benchmarks NAME`; its module is `benchmarks.NAME`), the
    results pages under docs/results/ that quote it (`page.md#section` where a section is meant), and
    what it measures, in a line."""

    name: str
    pages: tuple[str, ...]
    summary: str

    @property
    def module(self) -> str:
        return f"{__name__}.{self.name}"


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("backends", ("verifier-backends.md",),
              "our verifier (sessions, prefix reuse) against a stock stateless OpenAI-compatible server "
              "(llama-cpp-python's) on the same target"),
    Benchmark("batched_engine", ("verifier-engine.md",),
              "verified rows per second, several sessions' rounds in one batch against one round at a time "
              "(1-16 sessions, both targets, exact and fast numerics)"),
    Benchmark("budget_smoothing", ("budgets.md",),
              "how fast a session's acceptance estimate should move: GOODSPEED eq. 3's eta, on recorded "
              "drafting"),
    Benchmark("chat_loops", ("sampling.md",),
              "multi-turn qwen-coder chats under chat's sampling defaults and greedy: answers ending on "
              "end-of-text or the limit, loop flags, greedy against target-only"),
    Benchmark("draft_pool", ("pipelining.md",),
              "draft tokens per second of 1-8 tasks on one draft: one at a time, a `DraftPool` on threads, "
              "every task in one decode"),
    Benchmark("drafting_loop", ("drafting-policies.md",),
              "the client's drafting loop (`Drafter.block`) against raw `llama_decode` + argmax, same tokens, "
              "ratio per repeat"),
    Benchmark("drafting_policies", ("drafting-policies.md",),
              "fixed windows, p-min and the WISP predictor on held-out prompts (WISP Tables 4-6)"),
    Benchmark("engine_host", ("serving-stack.md",),
              "what the engine host's socket adds to an engine call (`edgekit serve --frontends`): a call of "
              "B sessions' rows made in process and through an `EngineHost`, best ids, kept rows and whole "
              "rows (through the socket and through shared memory), no model time"),
    Benchmark("estimator_fit", ("verifier-engine.md",),
              "how well the verification-time estimator fits measured batch times on this CPU (WISP Table 7, "
              "Fig. 9)"),
    Benchmark("exposure", ("robustness.md",),
              "a connection flood on `edgekit serve` (issue 66): 200 calls without a token that never send a "
              "message and 200 idle Rounds streams with it, opened again as they end, beside 16 honest "
              "devices: their rounds a second with and without it, every verdict against target-only "
              "decoding, health check latency, the verifier's threads and memory"),
    Benchmark("figures", ("index.md",),
              "redraws the figures the README and the documentation show from the stored JSON, running no "
              "model"),
    Benchmark("fixed_k", ("cpu-speculation.md",),
              "fixed draft window K: acceptance, AAL, rounds, passes per token, WDT, speed against "
              "target-only, losslessness"),
    Benchmark("fleet", ("capacity.md",),
              "the fleet simulator: N simulated devices replay recorded drafting against a real verifier; "
              "`record` the traces, `sweep` capacity per SLO class and policy"),
    Benchmark("fleet_replicas", ("capacity.md",),
              "capacity against 1-3 `edgekit serve` replicas behind HAProxy or nginx with `deploy/`'s "
              "configs, loaded by the fleet simulator"),
    Benchmark("flood_limit", ("serving-stack.md",),
              "one device flooding a verifier through `deploy/`'s HAProxy config, with its per-client call "
              "limit and without (six `serve_load.py` runs): the honest devices' rounds a second"),
    Benchmark("footprint", ("footprint.md",),
              "the client's memory beyond the model, cold start to the first drafted token, a run under a "
              "memory limit"),
    Benchmark("fuzz", ("robustness.md",),
              "thousands of hostile messages across every RPC of a real `edgekit serve` beside a well-behaved "
              "client: statuses, losslessness, memory"),
    Benchmark("goodspeed", ("budgets.md",),
              "server-assigned draft budgets (GOODSPEED) against Fixed-S and Random-S on the fleet simulator, "
              "or simulated (`--sim`); `sweep` for eta and beta, `summary`"),
    Benchmark("gpu_sim", ("capacity.md",),
              "capacity at GPU scale, by discrete-event simulation: the verifier's own schedulers over WISP's "
              "published A100 cost model"),
    Benchmark("grpc_call_cost", ("serving-stack.md",),
              "gRPC Python's cost per message on one core: unary calls against a stream per device, on the "
              "synchronous server and on grpc.aio"),
    Benchmark("install_size", ("footprint.md",),
              "what `pip install edgekit` and each extra put in a fresh venv"),
    Benchmark("link_sweep", ("links.md",),
              "FH, SH, the latency model's choice and WISV's 10 ms rule over 20 emulated links; the window "
              "(root: network namespaces)"),
    Benchmark("llama_backend_sampling", ("serving-stack.md",),
              "which of llama.cpp's backend-sampling outputs are each row's argmax with several output rows "
              "per sequence (greedy chain's token, top-k chain's candidates)"),
    Benchmark("llama_server_flags", ("verifier-backends.md",),
              "what the verifiers guide's llama-cpp-python server flags cost against its defaults, verifying "
              "the same drafts"),
    Benchmark("load", ("robustness.md",),
              "64 concurrent sessions against the real verifier for 10 minutes: errors, round latency, the "
              "verifier's memory"),
    Benchmark("logit_reduction", ("serving-stack.md",),
              "greedy rows reduced in llama.cpp's output buffer against rows copied out and reduced after; "
              "top-k sampling rows (`--mode sample`); llama.cpp's own argmax, its backend sampling "
              "(`--llama`); the host's cost of a GPU step's whole rows (`--mode host-cost`); target-only "
              "steps (`--k 0`)"),
    Benchmark("outage", ("outages.md",),
              "time to the end of an answer when the link is lost mid-answer: waiting against drafting "
              "through the outage"),
    Benchmark("parking", ("serving-stack.md",),
              "bringing a parked or reopened session back (KV copied out and in, re-prefilled, rebuilt from "
              "its history: `--out reopen`), and whether its next logits are bit-identical"),
    Benchmark("payloads", ("links.md",),
              "upload message sizes against WISV eqs. 3-9; fp16/int8 error on real draft hidden states"),
    Benchmark("pipeline", ("pipelining.md",),
              "proactive drafting, and 1-8 tasks one after another, pipelined and planned by `edgekit.plan`, "
              "on emulated links (root)"),
    Benchmark("prefill_interference", ("verifier-engine.md",),
              "a session's round latency while another session's long prompt is prefilled, by prefill chunk"),
    Benchmark("profile_drafting", ("drafting-policies.md", "footprint.md"),
              "per-token cost of a draft step, its logit features and the predictor (`edgekit profile`); "
              "`--kernels`: per logit kernel"),
    Benchmark("replay_check", ("cpu-speculation.md",),
              "cross-check of `fixed_k.py`: its rounds replayed from the draft alone; per-token draft/target "
              "agreement"),
    Benchmark("sampling_acceptance", ("sampling.md",),
              "acceptance under each sampler setting (temperature, top-k, top-p, min-p, repetition penalty, "
              "chat's defaults) beside greedy's, bootstrap intervals over prompts"),
    Benchmark("sampling_rows", ("sampling.md",),
              "what a sampling row costs the host at a drafted token: the whole distribution "
              "(`Sampler.probs`) against the bounds (`Sampler.accepts`), the decisions that fell back, and "
              "the device's `draft_distribution`; the target's own rows"),
    Benchmark("semantic", ("semantic.md",),
              "semantic verification (WISV) on held-out HumanEval with qwen-coder: pass@1, AAL, rounds and "
              "time per token on each link"),
    Benchmark("semantic_cost", ("semantic.md",),
              "what the target's hidden rows cost a verify pass (WISV semantic mode), logits bit-identical "
              "either way"),
    Benchmark("serve_load", ("serving-stack.md",),
              "one `edgekit serve` at 64-1,024 devices: rounds per second, a round's time by stage, the "
              "engine's busy share and a modelled GPU's inside it (`--device-step`), fairness (Jain's index); "
              "Verify calls or a stream per session; a flooding device; toy engine at zero cost or at a 7B "
              "target's H200 step times, or a real GGUF whose greedy rows are answered from recorded traces "
              "(`--kinds replayed`); drafting devices or target-only streams (`--generate`)"),
    Benchmark("side_by_side", ("side-by-side.md", "capacity.md"),
              "edgekit against local decoding, centralized serving and co-located speculation on one box as "
              "two machines, at RTT 0-200 ms; each policy against the per-prompt oracle; verifier CPU per "
              "token; capacity with 1-8 devices (issue 37)"),
    Benchmark("verifier_context", ("cpu-speculation.md",),
              "verifier time per round against context length: prefix reuse against re-prefill"),
    Benchmark("vllm_fleet", ("verifier-backends.md#a-fleet-against-one-vllm-issue-67",),
              "N = 1-64 devices (recorded drafting of vLLM's own greedy output) against one vLLM CPU server: "
              "rounds/s, committed tokens/s, requests and API-server CPU per round for the generate route, "
              "the K+1 prefixes and vLLM's own decoding (issue 67)"),
    Benchmark("vllm_rounds", ("verifier-backends.md",),
              "a K=4 round's time against the context (64-2,048 tokens) on a real vLLM by each route of the "
              "OpenAI transport, beside `edgekit serve`"),
    Benchmark("gpu.goodput", ("gpu.md",),
              "issue 51's sweep in one command: llama.cpp's step curve on the target, `llama-server -np N` "
              "against N streams (`rigs/streams.py`), `edgekit serve`'s target-only streams and N instant "
              "devices drafting blocks of K (`serve_load.py --kinds replayed`: the target's greedy rows "
              "answered from the traces), and edgekit's gain over plain decoding next to the roofline's for "
              "the traces' acceptance; `--dry-run` on the CPU (a test)"),
    Benchmark("gpu.make_target", ("gpu.md",),
              "a target where no weights can be downloaded: a GGUF with Qwen2.5-7B's (14B's, 32B's) "
              "architecture, the Qwen2.5 tokenizer copied from the qwen-coder target, random weights in F16, "
              "and Q4_K_M requantized from it (issue 51); a toy shape is a test "
              "(`tests/integration/test_gpu_target_gemma.py`)"),
    Benchmark("gpu.suite", ("gpu.md",),
              "the side-by-side comparison with the verifier on a GPU, at several RTTs, and the fleet; "
              "`--dry-run` on the CPU (a test); see `gpu/README.md`"),
)


def find(name: str) -> Benchmark:
    """The benchmark called `name` (KeyError, naming the close ones, if there is none)."""
    for b in BENCHMARKS:
        if b.name == name:
            return b
    import difflib

    close = difflib.get_close_matches(name, [b.name for b in BENCHMARKS], n=3)
    raise KeyError(f"no benchmark {name!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                "; python -m benchmarks --list names them"))


def run(name: str, argv: Sequence[str] = ()) -> Any:
    """Runs benchmark `name` with the command line `argv`, in this process, as
    `python -m benchmarks NAME ARGV...` would (the result JSON records that command); returns what
    its `main()` returns."""
    module = importlib.import_module(find(name).module)
    saved = sys.argv
    sys.argv = [f"python -m {__name__} {name}", *argv]  # argparse's usage line
    try:
        return module.main()
    finally:
        sys.argv = saved
