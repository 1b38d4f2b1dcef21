"""CLI transcripts: a command's whole output compared with what a person should see (as simonw/llm's
CLI tests compare them), once the spans that differ from run to run are placeholders.

Only what varies is replaced. Labels, counts, options echoed back and the text of a deterministic
(toy) model stay in the transcript, so a changed word or figure fails the test. `normalise(text)`:

  ANSI escapes          dropped: rich colours output that is no terminal where FORCE_COLOR,
                        PY_COLORS or GITHUB_ACTIONS is set
  trailing white space  dropped: rich pads each line to the console's width
  box-drawn lines       runs of spaces and of strokes folded to one (tables, panels): a column is
                        as wide as its widest cell, which may hold a varying figure (tests render
                        on a console too wide to wrap a cell: COLUMNS=2000)
  <time>                a log record's timestamp
  127.0.0.1:<port>      a port the OS picked (4-5 digits; a port a test names, as :9, stays)
  (<grpc detail>)       grpc's own words for a connection it could not make (they vary with its version)
  <tok/s> <ms> <us> <s> <Mbit/s>
                        a measured figure: a number with a decimal point and its unit (after a
                        space, a minus sign: a difference of noisy times may fall below 0), with any
                        padding that right-aligns it folded to one space (an option's value, as
                        "within 2 s" or "the 10 ms RTT rule", has no decimals and stays; costs in
                        "ms/step" and "ms/token" stay where they are defaults)
  figures a label names jitter; chat's "tokens per second", "time to first token" and link rates;
                        a rate too fast to time; train's best fixed window's goodput; profile's
                        "<%> of a step"; a probe's "<n> pings", its measured costs, its window
                        table's times, and the choice made on them ("<upload> with a window of
                        <k>"; the row it marks loses its mark)
  <device load>         chat's device row (CPU, memory; temperature and throttling where reported)
  invariant batch <n>, <batching>
                        what `edgekit serve` measured of this CPU's kernels at start-up
  a path                each one a test gives: normalise(text, {tmp_path: "<tmp>"})

A test's own rules (say, for a real model's text) go in `also`, with a comment saying why.

`normalise_json(text, varying)` is its twin for --json output: the text must be one JSON document
exactly as the CLI prints it (a two-space indent, or one line); the value of each field named in
`varying` becomes its placeholder, and the document is printed again with a two-space indent.
GENERATION names what varies in a generation's metrics, PROBE_LINK and PROBE in a probe's, PROFILE
in a profile's. Long transcripts live in tests/transcripts/ (`transcript(name)`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

_BOX = "│┃╭╮╰╯┏┓┗┛┡┩└┘┌┐├┤┠┨┣┫┳┻╇╈┼╋┬┴"
_NUMBER = r"\d+\.\d+"


def _fold(line: re.Match[str]) -> str:
    return re.sub(r"([─━═])[─━═]+", r"\1", re.sub(r" {2,}", " ", line.group(0).strip()))


_RULES: tuple[tuple[str, str | Callable[[re.Match[str]], str]], ...] = (
    (r"\x1b\[[0-9;?]*[A-Za-z]", ""),
    (r"[ \t]+$", ""),
    (rf"^ *[{_BOX}].*", _fold),
    (r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "<time> "),
    (r"\b(127\.0\.0\.1|localhost):\d{4,5}\b", r"\1:<port>"),
    (r"(is unavailable) \(.*\)(; is `edgekit serve` running there\?)", r"\1 (<grpc detail>)\2"),
    # figures a label names
    (rf"\(jitter {_NUMBER}\)", "(jitter <ms>)"),
    (r"\bup \d+ / down \d+ Mbit/s", "up <Mbit/s> / down <Mbit/s>"),
    (r"too fast to time \(rate ignored\)", "<Mbit/s>"),
    (rf"│ tokens per second │ {_NUMBER} │ {_NUMBER} │", "│ tokens per second │ <tok/s> │ <tok/s> │"),
    (r"│ time to first token │ \d+ ms │", "│ time to first token │ <ms> │"),
    (rf"(best fixed window \d+: ){_NUMBER}\)", r"\1<tok/s>)"),
    (rf" +(?:(?<= )-)?{_NUMBER}% of a step", " <%> of a step"),  # (profile's added share may be < 0: noise)
    (r"\(\d+ pings, ", "(<n> pings, "),
    (rf"(costs \(measured in a short generation\): draft ){_NUMBER} ms/step, verify {_NUMBER} \+ {_NUMBER} "
     rf"ms/token, acceptance {_NUMBER}", r"\1<ms>/step, verify <ms> + <ms>/token, acceptance <measured>"),
    (rf"^( +\d+) +{_NUMBER} +{_NUMBER}(  <)?$", r"\1   <ms>   <ms>"),
    (r"^policy: (FH|SH) with a window of \d+ ", "policy: <upload> with a window of <k> "),
    (r"(?:\d+% CPU|CPU not reported) · \d+ MB resident · \d+ MB free(?: · \d+ C)?(?: · THROTTLED)?",
     "<device load>"),
    (r"invariant batch \d+, (sessions batched together|each session's rows apart)",
     "invariant batch <n>, <batching>"),
    # figures with their unit
    (rf"( ?) *(?:(?<= )-)?\b{_NUMBER} (tok/s|Mbit/s|ms|us|s)\b(?!/)", r"\1<\2>"),
)
_COMPILED = tuple((re.compile(p, re.MULTILINE), r) for p, r in _RULES)


def normalise(
    text: str, paths: Mapping[str | PathLike[str], str] | None = None, also: Iterable[tuple[str, str]] = ()
) -> str:
    """`text` with what varies from run to run replaced by placeholders (see the module's docstring);
    each of `paths` by its placeholder, and then each (pattern, replacement) of `also`."""
    for path, placeholder in (paths or {}).items():
        text = text.replace(str(path), placeholder)
    for compiled, replacement in _COMPILED:
        text = compiled.sub(replacement, text)
    for pattern, placeholder in also:
        text = re.sub(pattern, placeholder, text, flags=re.MULTILINE)
    return text


# What varies in a generation's metrics (GenerationStats.to_dict): times, and the device's load.
GENERATION: Mapping[str, str] = {
    **dict.fromkeys(("draft_ms", "round_trip_ms", "prefill_ms",
                     "time_to_first_token_ms", "draft_ms_per_token"), "<ms>"),
    **dict.fromkeys(("server.queue_ms", "server.verify_ms", "server.estimated_ms"), "<ms>"),
    "server.batch_size": "<n>",
    "elapsed_s": "<s>",
    "tokens_per_second": "<tok/s>",
    "device.cpu_percent": "<%>",
    "device.process_rss_mb": "<MB>",
    "device.memory_available_mb": "<MB>",
    "device.temperature_c": "<C>",
    "device.throttled": "<bool>",
}


# What varies in `edgekit probe`'s JSON: the link it measured and the choice made on it (PROBE_LINK, for
# --link-only); with calibration rounds, the costs too, and what the rounds did (PROBE), which follows
# the models' answers (a real model's vary with llama.cpp's numerics on each CPU).
PROBE_LINK: Mapping[str, str] = {
    **{f"link.{k}": "<ms>" for k in ("rtt_ms", "rtt_jitter_ms")},
    **{f"link.{k}": "<Mbit/s>" for k in ("uplink_mbps", "downlink_mbps")},
    "link.samples": "<n>", "link.pings": "<n>", "link.probe_seconds": "<s>",
    "choice.upload": "<upload>", "choice.window": "<k>",
    **{f"choice.{k}": "<ms>" for k in ("round_ms", "ms_per_token", "rtt_rule_ms_per_token")},
    **dict.fromkeys(("fh_round_ms", "sh_round_ms", "fh_ms_per_token", "sh_ms_per_token"), "<ms>"),
}
PROBE: Mapping[str, str] = {
    **PROBE_LINK,
    "choice.rtt_rule_upload": "<upload>",  # the rounds' RTT, with a busy CPU's delays in it, may pass 10 ms
    **{f"costs.{k}": "<ms>" for k in ("draft_step_ms", "verify_ms.base", "verify_ms.per_token")},
    "costs.acceptance": "<measured>",
    **{f"calibration.{k}": "<n>" for k in ("rounds", "drafted", "accepted", "exchanges", "uplink_bytes",
                                           "downlink_bytes")},
    "calibration.uploads": "<uploads>",
}

# What varies in `edgekit profile`'s JSON: the times of this device's steps and their shares, its CPU.
PROFILE: Mapping[str, str] = {
    **dict.fromkeys(("median", "p99", "mean"), "<us>"),
    **dict.fromkeys(("added_share", "features_share", "predictor_share", "features_and_predictor_share"), "<share>"),
    "cpu": "<cpu>",
}


def normalise_json(
    text: str, varying: Mapping[str, str] = GENERATION, paths: Mapping[str | PathLike[str], str] | None = None
) -> str:
    """The JSON document `text` with the value of each field in `varying` (a key, or the dotted
    keys its path ends with: "device.cpu_percent") replaced by the placeholder given there,
    printed again with a two-space indent, each of `paths` replaced in it."""
    document = json.loads(text)
    printed = (json.dumps(document, indent=indent, ensure_ascii=False) + "\n" for indent in (2, None))
    assert text in printed, f"not one JSON document as the CLI prints it:\n{text}"
    rules = {tuple(k.split(".")): v for k, v in varying.items()}
    out = json.dumps(_replace(document, (), rules), indent=2, ensure_ascii=False) + "\n"
    for path, placeholder in (paths or {}).items():
        out = out.replace(str(path), placeholder)
    return out


def _replace(value: Any, path: tuple[str, ...], rules: Mapping[tuple[str, ...], str]) -> Any:
    for keys, placeholder in rules.items():
        if path[-len(keys):] == keys:
            return placeholder
    if isinstance(value, dict):
        return {k: _replace(v, (*path, k), rules) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, path, rules) for v in value]
    return value


def transcript(name: str) -> str:
    """The expected transcript tests/transcripts/NAME."""
    return (Path(__file__).parent / "transcripts" / name).read_text(encoding="utf-8")


def edgekit(*args: str, env: Mapping[str, str] | None = None, stdin: str | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """The real entry point, in a fresh process, with `stdin` or no standard input at all."""
    return subprocess.run(
        [sys.executable, "-m", "edgekit.cli.app", *args], capture_output=True, text=True, timeout=timeout,
        input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL, env={**os.environ, **(env or {})},
    )
