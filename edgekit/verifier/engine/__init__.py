"""Engines run batches of sequence feeds on a target model and decide nothing:
`LlamaEngine` on a GGUF file through llama.cpp, `ToyEngine` on a toy model for tests; `EngineHost`
serves one of them to several verifier processes, each driving it as a `RemoteEngine`."""

from ._base import Engine, Feed, FeedOutput, KeptRows, split_output
from ._cache import cpu_name, default_calibration_dir
from ._llama import LlamaEngine, calibrate_invariant_batches, call_rows
from ._remote import EngineHost, RemoteEngine
from ._toy import ToyEngine

__all__ = [
    "Engine", "EngineHost", "Feed", "FeedOutput", "KeptRows", "LlamaEngine", "RemoteEngine", "ToyEngine",
    "calibrate_invariant_batches",
    "call_rows", "cpu_name", "default_calibration_dir", "split_output",
]
