"""Draft hidden states on the wire (WISV's FH and SH uploads): encoding, decoding, checking.

A row is the draft model's final-layer hidden state at the step that produced
a draft token. Two encodings:

- fp16: little-endian IEEE half, row-major; 16 bits per element. Relative
  error about 2^-11 per element; values beyond 65504 cannot be sent.
- int8: symmetric, one float32 scale per row (max |x| / 127); 8 bits per
  element plus 32 per row. Error at most half a step (scale / 2) per element.

Both sides use this module: the device encodes, the verifier checks every field
against what the round allows and decodes. `HiddenStateError` says what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import HiddenStateError

__all__ = [
    "ENCODINGS",
    "EncodedHidden",
    "bits_per_element",
    "decode_hidden",
    "encode_hidden",
    "encoding_error",
]

ENCODINGS = ("fp16", "int8")
_FP16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class EncodedHidden:
    encoding: str
    count: int
    dim: int
    data: bytes
    scales: tuple[float, ...] = ()  # int8: one per row
    positions: tuple[int, ...] = ()  # block offsets of the rows; empty means 0..count-1

    @property
    def nbytes(self) -> int:
        """Payload bytes: the data plus the scales (framing not included)."""
        return len(self.data) + 4 * len(self.scales)


def bits_per_element(encoding: str, dim: int) -> float:
    """b_h of WISV eq. 3 for an encoding, per-row scales spread over the row."""
    if encoding == "fp16":
        return 16.0
    if encoding == "int8":
        return 8.0 + 32.0 / dim
    raise HiddenStateError(f"unknown hidden-state encoding {encoding!r}; use one of {', '.join(ENCODINGS)}")


def encode_hidden(rows: np.ndarray, encoding: str = "fp16", positions: Sequence[int] = ()) -> EncodedHidden:
    rows = np.asarray(rows, dtype=np.float32)
    if rows.ndim != 2:
        raise HiddenStateError(f"hidden states must be [count, dim], got shape {rows.shape}")
    if not np.all(np.isfinite(rows)):
        raise HiddenStateError("hidden states hold a NaN or infinity")
    count, dim = rows.shape
    if positions and len(positions) != count:
        raise HiddenStateError(f"{len(positions)} positions for {count} rows")
    if encoding == "fp16":
        if count and float(np.abs(rows).max()) > _FP16_MAX:
            raise HiddenStateError(f"a hidden value of {float(np.abs(rows).max()):g} does not fit fp16; use int8")
        return EncodedHidden("fp16", count, dim, rows.astype("<f2").tobytes(), (), tuple(positions))
    if encoding == "int8":
        peak = np.abs(rows).max(axis=1) if count else np.zeros(0, np.float32)
        scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q = np.clip(np.rint(rows / scales[:, None]), -127, 127).astype(np.int8)
        return EncodedHidden("int8", count, dim, q.tobytes(), tuple(float(s) for s in scales), tuple(positions))
    raise HiddenStateError(f"unknown hidden-state encoding {encoding!r}; use one of {', '.join(ENCODINGS)}")


def decode_hidden(h: EncodedHidden, *, dim: int | None = None, positions: Sequence[int] | None = None) -> np.ndarray:
    """The rows as float32 [count, dim]; checks every field first.

    `dim`: the width the session declared. `positions`: the block offsets the
    round expects, in order (FH: 0..K-1; SH: the requested ones).
    """
    if h.encoding not in ENCODINGS:
        raise HiddenStateError(f"hidden-state encoding {h.encoding!r} is not supported (use {', '.join(ENCODINGS)})")
    if dim is not None and h.dim != dim:
        raise HiddenStateError(f"hidden states are {h.dim} wide; the session's draft model has {dim}")
    if h.dim < 1:
        raise HiddenStateError("hidden states have width 0")
    if positions is not None:
        expected = list(positions)
        got = list(h.positions) or list(range(h.count))
        if h.count != len(expected):
            raise HiddenStateError(f"{h.count} hidden-state rows sent; the round needs {len(expected)}")
        if got != expected:
            raise HiddenStateError(f"hidden states for block offsets {got}; the round needs {expected}")
    elif h.positions and len(h.positions) != h.count:
        raise HiddenStateError(f"{len(h.positions)} positions for {h.count} rows")
    width = 2 if h.encoding == "fp16" else 1
    if len(h.data) != h.count * h.dim * width:
        raise HiddenStateError(
            f"{h.encoding} hidden data of {len(h.data)} bytes; {h.count} rows of {h.dim} need {h.count * h.dim * width}"
        )
    if h.encoding == "fp16":
        rows = np.frombuffer(h.data, dtype="<f2").astype(np.float32).reshape(h.count, h.dim)
    else:
        if len(h.scales) != h.count:
            raise HiddenStateError(f"int8 hidden states need one scale per row: {len(h.scales)} for {h.count} rows")
        scales = np.asarray(h.scales, dtype=np.float32)
        if not np.all(np.isfinite(scales)) or (scales.size and scales.min() <= 0):
            raise HiddenStateError("int8 hidden-state scales must be finite and positive")
        rows = np.frombuffer(h.data, dtype=np.int8).astype(np.float32).reshape(h.count, h.dim) * scales[:, None]
    if not np.all(np.isfinite(rows)):
        raise HiddenStateError("hidden states hold a NaN or infinity")
    return rows


def encoding_error(rows: np.ndarray, encoding: str) -> dict[str, float]:
    """What an encoding loses on these rows: worst absolute error, relative RMS
    error, and the lowest cosine similarity of a decoded row to its original."""
    rows = np.asarray(rows, dtype=np.float32)
    back = decode_hidden(encode_hidden(rows, encoding))
    diff = (back - rows).astype(np.float64)
    norms = np.linalg.norm(rows, axis=1) * np.linalg.norm(back, axis=1)
    cos = np.sum(rows.astype(np.float64) * back, axis=1) / np.where(norms > 0, norms, 1.0)
    return {
        "max_abs": float(np.abs(diff).max()) if diff.size else 0.0,
        "rel_rms": float(np.sqrt(np.mean(diff**2)) / max(np.sqrt(np.mean(rows.astype(np.float64) ** 2)), 1e-30)),
        "min_cosine": float(cos.min()) if cos.size else 1.0,
    }
