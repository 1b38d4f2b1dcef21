"""`edgekit serve` in a process of its own, for tests of what a package adds to it (a scheduler, an
engine): started with a plugin's folder on its PYTHONPATH, read until it says how it schedules."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def serving(args: list[str], plugin: Path) -> Iterator[tuple[str, list[str]]]:
    """(its address, the lines it printed up to its scheduling line); on leaving, SIGTERM and a clean
    exit (asserted), or a kill if it never got that far."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.app", "serve", "--port", "0", *args],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(plugin)},
    )
    try:
        lines: list[str] = []
        while not any(line.startswith("scheduling: ") for line in lines) and len(lines) < 20:
            lines.append(proc.stderr.readline())  # type: ignore[union-attr]
            assert lines[-1], "".join(lines)  # not the end of the output
        found = re.search(r"edgekit verifier: .* on (127\.0\.0\.1:\d+) \(", "".join(lines))
        assert found, "".join(lines)
        yield found.group(1), lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
