"""The rejection predictor at run time: an ONNX classifier of draft steps, for
the controller that stops drafting at its first predicted rejection
(`edgekit.drafting.PredictorController`, WISP sec. 4.1, eq. 25).

A predictor is an ONNX model with one float input `[N, F]` of features and an
output giving the probability that the token is accepted, either `[N]`,
`[N, 1]` or `[N, 2]` (the second column). Which features, in which order, is
read from the model's metadata key `edgekit.features` (comma-separated names
from `FEATURE_NAMES`); a model without it must take all of `FEATURE_NAMES` in
order. `edgekit.threshold` holds the operating threshold chosen at training and
`edgekit.stop` the stop rule ("before": a predicted rejection is not sent, WISP
eq. 25; "after": it is sent as the block's last token), also chosen there.
The metric card beside the model (`<stem>.json`, as training writes it) may hold
a "delay_schedule": the rule for each round cost (`DelaySchedule`), read here;
a card that cannot be used (unreadable, malformed, another model's) is warned
about and left out, and the model runs at its one operating threshold.
A model that does not fit is refused when loaded, with the reason.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DependencyMissingError, PredictorError
from ..runtime import FEATURE_NAMES, LogitStats
from ._delay import DelaySchedule

if TYPE_CHECKING:
    from ._controller import StopRule

__all__ = ["OnnxPredictor"]


class OnnxPredictor:
    """Probability that a drafted token is accepted, from its feature vector.

    `p_accept(features)` runs one row of `FEATURE_NAMES` through buffers bound
    to the session once (ONNX Runtime's IOBinding), the cheapest call it has:
    inside the drafting loop each call starts with cold caches.
    `p_accept_step(stats, position, recent_acceptance)`, the drafting loop's
    path, has a step's `LogitStats` write its features straight into that input.
    Both are one decision at a time, as the client's draft lock orders them;
    `p_accept_batch` allocates and may be called from anywhere."""

    def __init__(self, path: str | os.PathLike[str], *, threshold: float | None = None, schedule: bool = True) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise DependencyMissingError("onnxruntime", "predictor") from exc
        fixed = threshold is not None  # a threshold given: one for every round, no schedule
        self.path = Path(path)
        if not self.path.is_file():
            raise PredictorError(f"no predictor at {self.path}")
        opts = ort.SessionOptions()
        # One decision per drafted token: a thread pool only adds wake-up latency.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for bad files
            raise PredictorError(f"{self.path} is not a usable ONNX model: {exc}") from exc
        self._run_options = ort.RunOptions()
        meta = self._session.get_modelmeta().custom_metadata_map
        self.metadata = dict(meta)
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            raise PredictorError(f"{self.path}: a predictor takes one input, this one takes {len(inputs)}")
        inp = inputs[0]
        listed = meta.get("edgekit.features")
        names = tuple(n.strip() for n in listed.split(",")) if listed is not None else FEATURE_NAMES
        unknown = [n for n in names if n not in FEATURE_NAMES]
        if unknown:
            raise PredictorError(
                f"{self.path}: unknown features {', '.join(unknown)}; edgekit computes {', '.join(FEATURE_NAMES)}"
            )
        width = inp.shape[-1] if len(inp.shape) == 2 else None
        if inp.type != "tensor(float)" or width != len(names):
            raise PredictorError(
                f"{self.path}: the input {inp.name!r} is {inp.type} {inp.shape}; "
                f"expected tensor(float) [N, {len(names)}] "
                f"for features {', '.join(names)}"
            )
        self.feature_names = names
        self._columns = np.array([FEATURE_NAMES.index(n) for n in names])
        self._column_bytes = bytes(self._columns.tolist())
        self._input = inp.name
        out = self._session.get_outputs()[0]
        if out.type != "tensor(float)":
            raise PredictorError(
                f"{self.path}: the output {out.name!r} is {out.type}; expected tensor(float) probabilities"
            )
        self._output = out.name
        if threshold is None:
            threshold = float(meta.get("edgekit.threshold", 0.5))
        if not 0.0 <= threshold <= 1.0:
            raise PredictorError(f"threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold
        stop = meta.get("edgekit.stop", "before")
        if stop not in ("before", "after"):
            raise PredictorError(f"{self.path}: edgekit.stop must be 'before' or 'after', got {stop!r}")
        self.stop: StopRule = stop
        # the card's schedule; `schedule=False`: not read (training scores a model it is rewriting the card of)
        self.schedule = self._read_schedule() if schedule and not fixed else None
        self._check_output()
        self._bind()

    def _read_schedule(self) -> DelaySchedule | None:
        """The delay schedule in the card beside the model, if it has one and the card is this
        model's (its threshold and stop rule are the model's metadata). A card that cannot be
        used costs the schedule, not the model: a warning says why, and the model runs at its
        one operating threshold."""
        card_path = self.path.with_suffix(".json")
        if not card_path.is_file():
            return None
        try:
            card = json.loads(card_path.read_text())
            entries = card.get("delay_schedule") if isinstance(card, dict) else None
            if entries is None:
                return None
            if "edgekit.threshold" in self.metadata and (
                not math.isclose(float(card.get("threshold", -1.0)), self.threshold, abs_tol=1e-6)
                or card.get("stop") != self.stop
            ):
                raise PredictorError(
                    f"{card_path}: the card's threshold and stop rule ({card.get('threshold')}, {card.get('stop')}) "
                    f"are not the model's ({self.threshold}, {self.stop}): another model's card"
                )
            return DelaySchedule.from_card(entries, str(card_path))
        except (OSError, ValueError, TypeError, PredictorError) as exc:
            warnings.warn(f"{self.path}: its delay schedule is not used ({exc}); drafting at its one operating "
                          "threshold", RuntimeWarning, stacklevel=3)
            return None

    def _check_output(self) -> None:
        try:
            p = self.p_accept_batch(np.full((3, len(FEATURE_NAMES)), 0.5, dtype=np.float32))
        except Exception as exc:
            raise PredictorError(f"{self.path}: running it on a test input failed: {exc}") from exc
        if p.shape != (3,) or not np.all((p >= 0) & (p <= 1)):
            raise PredictorError(
                f"{self.path}: the output must be probabilities shaped [N], [N, 1] or [N, 2]; got {p.shape} {p[:3]}"
            )

    def _bind(self) -> None:
        """Binds a one-row input and its output to numpy buffers, shaped by a trial run."""
        self._x = np.zeros((1, len(self.feature_names)), dtype=np.float32)
        y = np.asarray(self._session.run([self._output], {self._input: self._x})[0])
        self._y = np.zeros(y.shape, dtype=np.float32)
        self._binding = self._session.io_binding()
        self._binding.bind_cpu_input(self._input, self._x)
        self._binding.bind_output(self._output, "cpu", 0, np.float32, list(self._y.shape), self._y.ctypes.data)
        # onnxruntime's Python classes wrap C++ ones; calling those directly skips a
        # Python frame per decision (~10 us cold in the loop). The public call otherwise.
        # Run options made once (__init__): without them each call builds its own, ~15 us cold.
        sess, iob = getattr(self._session, "_sess", None), getattr(self._binding, "_iobinding", None)
        if sess is not None and iob is not None and hasattr(sess, "run_with_iobinding"):
            self._run_bound = functools.partial(sess.run_with_iobinding, iob, self._run_options)  # C calls only
        else:
            self._run_bound = functools.partial(self._session.run_with_iobinding, self._binding, self._run_options)

    def p_accept_batch(self, features: np.ndarray) -> np.ndarray:
        """Acceptance probabilities for rows of full `FEATURE_NAMES` vectors."""
        x = np.ascontiguousarray(features[:, self._columns], dtype=np.float32)
        out = np.asarray(self._session.run([self._output], {self._input: x})[0])
        if out.ndim == 2 and out.shape[1] == 2:
            out = out[:, 1]
        return out.reshape(len(x)) if out.size == len(x) else out

    def p_accept(self, features: np.ndarray) -> float:
        """The acceptance probability of one full `FEATURE_NAMES` vector."""
        np.take(features, self._columns, out=self._x[0])
        return self._run()

    def p_accept_step(self, stats: LogitStats, position: int, recent_acceptance: float) -> float:
        """The acceptance probability of a draft step's token, from its logit
        statistics: the features go straight into the bound input (the drafting loop's path)."""
        stats.features_into(self._x, self._column_bytes, position, recent_acceptance)
        self._run_bound()  # _run, inlined: each Python frame costs microseconds with cold caches
        return self._y.item(-1)

    def _run(self) -> float:
        """The model on the bound input row."""
        self._run_bound()
        return self._y.item(-1)  # [1], [1, 1], or [1, 2] with P(accept) second
