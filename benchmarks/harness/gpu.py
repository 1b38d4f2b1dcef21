"""The GPU's busy share over a measuring window, from nvidia-smi (where there is one).

`nvidia-smi --query-gpu=utilization.gpu -lms 100` prints, every 100 ms, the share of the last
sample period in which a kernel was running: the same instrument for any server on the GPU, so
GPU time per committed token compares a stock server with edgekit's (busy share x window /
tokens). It counts a period as busy if any kernel ran in it, so a GPU running small kernels can
show busy while far from its peak: a ceiling on GPU time, not a count of work done.
"""

from __future__ import annotations

import shutil
import subprocess
from types import TracebackType


class GpuUtilization:
    """A context manager: nvidia-smi sampling the first GPU's utilization while the block runs;
    `mean` (a share, 0-1) and `samples` after it, None and 0 where there is no nvidia-smi."""

    def __init__(self, period_ms: int = 100, binary: str = "nvidia-smi") -> None:
        self.period_ms = period_ms
        self.binary = shutil.which(binary)
        self.mean: float | None = None
        self.samples = 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> GpuUtilization:
        if self.binary:
            self._proc = subprocess.Popen(
                [self.binary, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0",
                 "-lms", str(self.period_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        values = [float(line) for line in out.split() if _number(line)]
        self.samples = len(values)
        self.mean = sum(values) / len(values) / 100 if values else None


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
