"""What edgekit runs models on: llama.cpp through its ctypes API (this package
is the only place that touches ctypes), the draft model seam, the compiled
logit-statistics kernel, the draft pool (several tasks on one draft, their steps
batched), the requantizer, the device's resources (psutil), and a toy language
model for tests; a GGUF file's metadata read without llama.cpp, and the padding entries a
vocabulary may end with."""

from ._device import (
    DeviceLoad,
    DeviceState,
    MemoryNeed,
    check_memory,
    device_load,
    device_state,
    model_memory_need,
    physical_cores,
    process_cpu_seconds,
)
from ._draft import DraftModel, DraftOutput, LlamaDraftModel
from ._gguf import SPLIT_NAME, GGUFArray, read_metadata, split_parts
from ._llama import LlamaContext, LlamaModel, default_threads, env_gpu_layers, gpu_offload, llama_build
from ._logits import (
    ALL_COLUMNS,
    FEATURE_NAMES,
    KERNEL,
    TAIL_NATS,
    LogitStats,
    NumpyLogitStats,
    available_kernels,
    current_kernel,
    kept_of,
    kept_rows,
    use_kernel,
)
from ._pool import DraftPool, DraftSlot, LlamaPoolBackend, PoolBackend, Step
from ._quantize import quantizer_command
from ._toy import ToyLanguageModel
from ._vocab import GGUF_PADDING_TYPES, LLAMA_PADDING_ATTRS, is_padding_text, trailing_padding

__all__ = [
    "ALL_COLUMNS",
    "FEATURE_NAMES",
    "GGUF_PADDING_TYPES",
    "KERNEL",
    "LLAMA_PADDING_ATTRS",
    "SPLIT_NAME",
    "TAIL_NATS",
    "DeviceLoad",
    "DeviceState",
    "DraftModel",
    "DraftOutput",
    "DraftPool",
    "DraftSlot",
    "GGUFArray",
    "LlamaContext",
    "LlamaDraftModel",
    "LlamaModel",
    "LlamaPoolBackend",
    "LogitStats",
    "MemoryNeed",
    "NumpyLogitStats",
    "PoolBackend",
    "Step",
    "ToyLanguageModel",
    "available_kernels",
    "check_memory",
    "current_kernel",
    "default_threads",
    "device_load",
    "device_state",
    "env_gpu_layers",
    "gpu_offload",
    "is_padding_text",
    "kept_of",
    "kept_rows",
    "llama_build",
    "model_memory_need",
    "physical_cores",
    "process_cpu_seconds",
    "quantizer_command",
    "read_metadata",
    "split_parts",
    "trailing_padding",
    "use_kernel",
]
