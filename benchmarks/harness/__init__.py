"""The benchmarks' harness: what every script in `benchmarks/` shares, a room per job.

- `cli`: the command line (`arguments`, `common`, `parse`: shared options spelled one way,
  `--threads`, `--replot`), `csv_list`, `apply_threads`.
- `machine`: what a result was measured on (`machine`, `print_machine`, `gpu_name`).
- `gpu`: the GPU's busy share over a window (`GpuUtilization`, from nvidia-smi).
- `prompts`: the prompt sets (`load_prompts`).
- `stats`: `median`, `percentile`, `ratio`.
- `output`: the result's JSON (`write_result`), tables (`table`, `fmt`), `progress` lines.
- `plots`: figures beside the JSON (`subplots`, `save_figure`).
- `processes`: `free_port`, `wait_listening`, `stop_process`, `pinned`; `module_command` and
  `module_env` (a module of the package in a child process).

Benchmarks import it as one namespace (`from benchmarks import harness as C`); the rigs that several
benchmarks drive (the fleet simulator, the load generator, the peers, the proxies) are in `rigs/`.
"""

from __future__ import annotations

from pathlib import Path

from .cli import COMMON_OPTIONS, THREADS_HELP, apply_threads, arguments, common, csv_list, parse, replot
from .gpu import GpuUtilization
from .machine import gpu_name, machine, print_machine
from .output import RESULTS_DIR, fmt, json_default, progress, table, write_result
from .plots import save_figure, subplots
from .processes import free_port, module_command, module_env, pinned, stop_process, wait_listening
from .prompts import PROMPT_KINDS, PROMPTS_DIR, load_prompts
from .stats import median, percentile, ratio

BENCH_DIR = Path(__file__).resolve().parents[1]

__all__ = [
    "BENCH_DIR",
    "COMMON_OPTIONS",
    "PROMPTS_DIR",
    "PROMPT_KINDS",
    "RESULTS_DIR",
    "THREADS_HELP",
    "GpuUtilization",
    "apply_threads",
    "arguments",
    "common",
    "csv_list",
    "fmt",
    "free_port",
    "gpu_name",
    "json_default",
    "load_prompts",
    "machine",
    "median",
    "module_command",
    "module_env",
    "parse",
    "percentile",
    "pinned",
    "print_machine",
    "progress",
    "ratio",
    "replot",
    "save_figure",
    "stop_process",
    "subplots",
    "table",
    "wait_listening",
    "write_result",
]
