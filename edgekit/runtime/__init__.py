"""What edgekit runs models on: llama.cpp through its ctypes API (this package
is the only place that touches ctypes), the draft model seam, the compiled
logit-statistics kernel, the draft pool (several tasks on one draft, their steps
batched), the requantizer, and a toy language model for tests."""

from ._draft import DraftModel, DraftOutput, LlamaDraftModel
from ._llama import LlamaContext, LlamaModel, default_threads
from ._logits import ALL_COLUMNS, FEATURE_NAMES, KERNEL, TAIL_NATS, LogitStats, NumpyLogitStats
from ._pool import DraftPool, DraftSlot, LlamaPoolBackend, PoolBackend, Step
from ._quantize import quantizer_command
from ._toy import ToyLanguageModel

__all__ = [
    "ALL_COLUMNS",
    "FEATURE_NAMES",
    "KERNEL",
    "TAIL_NATS",
    "DraftModel",
    "DraftOutput",
    "DraftPool",
    "DraftSlot",
    "LlamaContext",
    "LlamaDraftModel",
    "LlamaModel",
    "LlamaPoolBackend",
    "LogitStats",
    "NumpyLogitStats",
    "PoolBackend",
    "Step",
    "ToyLanguageModel",
    "default_threads",
    "quantizer_command",
]
