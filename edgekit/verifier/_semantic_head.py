"""The semantic head on the verifier: an ONNX decision head run with onnxruntime.

A head is an ONNX model with one float input `[N, F]` and one output `[N, 1]`
(or `[N]`), P(reject) of each mismatch (WISV eqs. 24-25). Its metadata says
what it reads: `edgekit.draft_hidden` and `edgekit.target_hidden` (widths),
`edgekit.target_features` (the names from `confidence.TARGET_FEATURES` for a
head that reads the target's confidence at the mismatch; absent or empty
otherwise), `edgekit.csi` (the CSI feature names from `csi.CSI_FEATURES`,
comma-separated; empty for a head without CSI), `edgekit.threshold` (the
operating threshold chosen at training) and `edgekit.pair`. F must be the sum of
the widths, in that order. A head
that does not fit, or a pair whose hidden sizes differ from it, is refused with
the reason (`SemanticHeadError`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from ..errors import DependencyMissingError, SemanticHeadError
from ..protocol import LinkState
from ._confidence import TARGET_FEATURES, target_features
from ._csi import CSI_FEATURES, csi_features

__all__ = ["SemanticHead"]


class SemanticHead:
    """P(reject) of mismatches from [h_draft, h_target, (the target's confidence,) CSI]."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise DependencyMissingError("onnxruntime") from exc
        self.path = Path(path)
        if not self.path.is_file():
            raise SemanticHeadError(f"no semantic head at {self.path}")
        data = self.path.read_bytes()
        # What verdicts name the head by: its file's name and the start of its digest.
        self.identity = f"{self.path.stem}:{hashlib.sha256(data).hexdigest()[:12]}"
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own exception types for bad files
            raise SemanticHeadError(f"{self.path} is not a usable ONNX model: {exc}") from exc
        meta = dict(self._session.get_modelmeta().custom_metadata_map)
        self.metadata = meta
        try:
            self.draft_hidden = int(meta["edgekit.draft_hidden"])
            self.target_hidden = int(meta["edgekit.target_hidden"])
            self.threshold = float(meta.get("edgekit.threshold", "0.5"))
        except (KeyError, ValueError) as exc:
            raise SemanticHeadError(
                f"{self.path} is not an edgekit semantic head: its metadata lacks {exc} "
                "(train one with `edgekit semantic train`)"
            ) from None
        if not 0.0 <= self.threshold <= 1.0:
            raise SemanticHeadError(f"{self.path}: its threshold {self.threshold} is outside [0, 1]")
        names = tuple(n for n in meta.get("edgekit.csi", "").split(",") if n)
        if names and names != CSI_FEATURES:
            raise SemanticHeadError(
                f"{self.path} reads CSI features {', '.join(names)}; edgekit computes {', '.join(CSI_FEATURES)}"
            )
        self.uses_csi = bool(names)
        stats = tuple(n for n in meta.get("edgekit.target_features", "").split(",") if n)
        if stats and stats != TARGET_FEATURES:
            raise SemanticHeadError(
                f"{self.path} reads target features {', '.join(stats)}; edgekit computes {', '.join(TARGET_FEATURES)}"
            )
        self.uses_target_features = bool(stats)
        self.pair = meta.get("edgekit.pair", "")
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise SemanticHeadError(f"{self.path}: a semantic head has one input and one output")
        out = outputs[0]
        if out.type != "tensor(float)" or not (
            len(out.shape) == 1 or (len(out.shape) == 2 and out.shape[1] in (1, "1"))
        ):
            raise SemanticHeadError(
                f"{self.path}: its output is {out.type} {out.shape}; a head gives P(reject) as tensor(float) [N, 1]"
            )
        self._input = inputs[0].name
        width = (
            self.draft_hidden
            + self.target_hidden
            + (len(TARGET_FEATURES) if self.uses_target_features else 0)
            + (len(CSI_FEATURES) if self.uses_csi else 0)
        )
        shape = inputs[0].shape
        if inputs[0].type != "tensor(float)" or len(shape) != 2 or shape[1] != width:
            raise SemanticHeadError(
                f"{self.path}: its input is {inputs[0].type} {shape}; its metadata says [N, {width}] "
                f"({self.draft_hidden} draft + {self.target_hidden} target hidden"
                f"{' + target confidence' if self.uses_target_features else ''}{' + CSI' if self.uses_csi else ''})"
            )
        self.width = width

    def check_pair(self, draft_hidden: int, target_hidden: int) -> None:
        """Refuses a pair whose hidden sizes are not the head's."""
        if (draft_hidden, target_hidden) != (self.draft_hidden, self.target_hidden):
            raise SemanticHeadError(
                f"the semantic head {self.identity} reads a {self.draft_hidden}-wide draft and a "
                f"{self.target_hidden}-wide target hidden state; this pair has {draft_hidden} and {target_hidden}"
                + (f" (the head was trained for {self.pair})" if self.pair else "")
            )

    def p_reject(
        self,
        h_draft: np.ndarray,
        h_target: np.ndarray,
        link: LinkState | None,
        logits: np.ndarray | None = None,
        draft_tokens: np.ndarray | None = None,
    ) -> np.ndarray:
        """P(reject) of each row pair, float64 [m]. `logits` (the target's rows at the mismatches)
        and `draft_tokens` are read by a head with target features, and required by it."""
        h_draft = np.asarray(h_draft, dtype=np.float32)
        h_target = np.asarray(h_target, dtype=np.float32)
        if h_draft.ndim != 2 or h_target.ndim != 2 or len(h_draft) != len(h_target):
            raise SemanticHeadError(f"hidden rows of shapes {h_draft.shape} and {h_target.shape} do not pair up")
        if h_draft.shape[1] != self.draft_hidden or h_target.shape[1] != self.target_hidden:
            self.check_pair(h_draft.shape[1], h_target.shape[1])
        if not len(h_draft):
            return np.zeros(0)
        parts = [h_draft, h_target]
        if self.uses_target_features:
            if logits is None or draft_tokens is None:
                raise SemanticHeadError(
                    f"the semantic head {self.identity} reads the target's confidence: pass the target's logits "
                    "rows and the draft's tokens at the mismatches"
                )
            try:
                parts.append(target_features(logits, draft_tokens))
            except ValueError as exc:
                raise SemanticHeadError(f"target features for {self.identity}: {exc}") from None
        if self.uses_csi:
            parts.append(np.broadcast_to(csi_features(link), (len(h_draft), len(CSI_FEATURES))))
        x = np.ascontiguousarray(np.hstack(parts), dtype=np.float32)
        (out,) = self._session.run(None, {self._input: x})
        return np.asarray(out, dtype=np.float64).reshape(len(h_draft))
