"""Packages that extend edgekit by entry point, written as `pip install` would leave them on a path
(a module and its dist-info): put the folder on sys.path, or give it to a process as PYTHONPATH."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path


def plugin_package(root: Path, module: str, source: str, entry_points: Mapping[str, Mapping[str, str]]) -> Path:
    """`module`.py holding `source`, and its entry points by group ({"edgekit.engines": {name: "mod:attr"}}),
    under `root`; returns `root`."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
        for group, points in entry_points.items()))
    return root


# A scheduler of one's own: FCFS without batching, each batch one session's work.
ONE_AT_A_TIME = textwrap.dedent('''
    from edgekit.verifier.scheduler import FcfsScheduler


    class OneAtATime(FcfsScheduler):
        name = "one-at-a-time"


    def build(estimator, config):
        return OneAtATime(max_rows=config.max_batch_rows, max_works=1, prefill_chunk=config.prefill_chunk,
                          max_queue=config.max_queue)
''')


def one_at_a_time(root: Path) -> Path:
    """A package adding the scheduler "one-at-a-time" (`edgekit.schedulers`)."""
    return plugin_package(root, "one_at_a_time", ONE_AT_A_TIME,
                          {"edgekit.schedulers": {"one-at-a-time": "one_at_a_time:build"}})
