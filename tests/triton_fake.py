"""A local Triton Inference Server serving TensorRT-LLM's `tensorrt_llm` model over a toy target,
as the KServe v2 HTTP/REST protocol and tensorrtllm_backend document them: the transport for
TensorRT-LLM on Triton is tested against it (tests/unit/transport/test_triton.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from http_fakes import _LocalJSONServer

from edgekit.testing import ToyLanguageModel

# The tensorrt_llm model's tensors a round can touch, as its config.pbtxt declares them (dims after
# the batch dimension, which Triton's metadata puts first for a model with max_batch_size > 0).
TENSORRT_LLM_INPUTS = (
    ("input_ids", "INT32", [-1]),
    ("input_lengths", "INT32", [1]),
    ("request_output_len", "INT32", [1]),
    ("draft_input_ids", "INT32", [-1]),
    ("draft_logits", "FP32", [-1, -1]),
    ("draft_acceptance_threshold", "FP32", [1]),
    ("end_id", "INT32", [1]),
    ("pad_id", "INT32", [1]),
    ("beam_width", "INT32", [1]),
    ("runtime_top_k", "INT32", [1]),
    ("temperature", "FP32", [1]),
    ("streaming", "BOOL", [1]),
)
TENSORRT_LLM_OUTPUTS = (("output_ids", "INT32", [-1, -1]), ("sequence_length", "INT32", [-1]))
# The rest of tensorrtllm_backend's inflight_batcher_llm repository: text in, text out.
ENSEMBLE_INPUTS = (("text_input", "BYTES", [1]), ("max_tokens", "INT32", [1]), ("end_id", "INT32", [1]))


class FakeTritonServer(_LocalJSONServer):
    """Triton over a toy target, serving `name` as TensorRT-LLM's tensorrt_llm model (and an
    `ensemble`, `preprocessing` and `postprocessing` beside it):

    - GET /v2/health/ready: 200 with no body (400 while not `ready`);
    - GET /v2/models/{name}: the metadata (inputs and outputs: name, datatype, shape); a model it does
      not serve is answered 400 {"error": "Request for unknown model: ..."}, as Triton answers;
    - GET /v2/models/{name}/config: its configuration, whose `exclude_input_in_output` parameter says
      whether `output_ids` holds the input first (left as the template's "${...}" unless `declares`);
    - POST /v2/repository/index: the models, a JSON array;
    - POST /v2/models/{name}/infer: {"inputs": [{name, shape, datatype, data}], "outputs": [...]}.

    An infer request is decoded as TensorRT-LLM's executor does with ExternalDraftTokensConfig, greedily:
    the draft's prefix that matches the target's greedy tokens is accepted and the target's next token
    follows in one step, then it goes on greedily until `request_output_len` tokens or `end_id`. At
    `end_id` it stops and leaves it out of `output_ids` (TensorRT-LLM issue 2190), or with
    `end_in_output` keeps it and pads with it to `request_output_len`, `sequence_length` counting
    the padding (tensorrtllm_backend issue 634). `output_ids` is [1, 1, T], `sequence_length` [1, 1].
    A block longer than `max_draft_len` is refused in the executor's words; with `max_seq_len`, the
    tokens asked are cut so that input, output and draft fit (as the executor does, with a warning).
    Each infer request is in `infers`, and how many draft tokens each accepted in `accepted`.

    `fault` (those of every fake server): "http500", "not-json", "slow", "drop" (closes the
    connection without an answer, once).
    """

    def __init__(self, lm: ToyLanguageModel, *, name: str = "tensorrt_llm", max_draft_len: int = 8,
                 exclude_input_in_output: bool = False, declares: bool = True, end_in_output: bool = False,
                 max_seq_len: int | None = None) -> None:
        super().__init__()
        self.lm, self.name, self.max_draft_len = lm, name, max_draft_len
        self.exclude, self.declares, self.end_in_output, self.max_seq_len = (
            exclude_input_in_output, declares, end_in_output, max_seq_len)
        self.ready = True
        self.infers: list[dict] = []
        self.accepted: list[tuple[int, int]] = []  # (accepted, drafted) of each infer request
        self.models = {name: (TENSORRT_LLM_INPUTS, TENSORRT_LLM_OUTPUTS), "ensemble": (ENSEMBLE_INPUTS, ()),
                       "preprocessing": (ENSEMBLE_INPUTS[:2], ()), "postprocessing": ((), ())}
        server = self

        class Handler(self._httpd.RequestHandlerClass):  # type: ignore[name-defined,misc]
            def do_GET(self) -> None:
                status, answer = server.get(self.path)
                if answer is None:
                    self._send(status, b"")  # Triton's health answers carry no body
                else:
                    self._answer(status, answer)

        self._httpd.RequestHandlerClass = Handler

    def get(self, path: str) -> tuple[int, object]:
        if path == "/v2/health/ready":
            return (200, None) if self.ready else (400, None)
        parts = path.strip("/").split("/")
        if len(parts) in (3, 4) and parts[:2] == ["v2", "models"]:
            model = parts[2]
            if model not in self.models:
                return self._unknown(model)
            if len(parts) == 3:
                return 200, self.metadata(model)
            if parts[3] == "config":
                return 200, self.config(model)
        return 404, {"error": "Not Found"}

    def post(self, path: str, req: dict) -> tuple[int, object]:
        if path == "/v2/repository/index":
            return 200, [{"name": m, "version": "1", "state": "READY"} for m in self.models]
        parts = path.strip("/").split("/")
        if len(parts) == 4 and parts[:2] == ["v2", "models"] and parts[3] == "infer":
            if parts[2] not in self.models:
                return self._unknown(parts[2])
            if parts[2] != self.name:
                return 400, {"error": f"in ensemble '{parts[2]}', expected input 'text_input'"}
            self.infers.append(req)
            return self.infer(req)
        return 404, {"error": "Not Found"}

    def _unknown(self, model: str) -> tuple[int, object]:
        return 400, {"error": f"Request for unknown model: '{model}' is not found"}

    def metadata(self, model: str) -> dict:
        inputs, outputs = self.models[model]

        def tensors(specs: Sequence[tuple[str, str, list[int]]]) -> list[dict]:
            return [{"name": n, "datatype": t, "shape": [-1, *dims]} for n, t, dims in specs]

        return {"name": model, "versions": ["1"], "platform": "tensorrtllm" if model == self.name else "ensemble",
                "inputs": tensors(inputs), "outputs": tensors(outputs)}

    def config(self, model: str) -> dict:
        exclude = str(self.exclude).lower() if self.declares else "${exclude_input_in_output}"
        return {"name": model, "backend": "tensorrtllm", "max_batch_size": 8,
                "parameters": {"exclude_input_in_output": {"string_value": exclude},
                               "enable_kv_cache_reuse": {"string_value": "false"}}}

    def infer(self, req: dict) -> tuple[int, object]:
        declared = {n: (t, dims) for n, t, dims in TENSORRT_LLM_INPUTS}
        given: dict[str, list] = {}
        for t in req.get("inputs", []):
            name = t["name"]
            if name not in declared:
                return 400, {"error": f"unexpected inference input '{name}' for model '{self.name}'"}
            datatype, dims = declared[name]
            if t["datatype"] != datatype:
                return 400, {"error": f"inference input '{name}' data-type is '{t['datatype']}', but model "
                                      f"'{self.name}' expects '{datatype}'"}
            shape, data = t["shape"], t["data"]
            if len(shape) != len(dims) + 1 or shape[0] != 1 or int(np.prod(shape)) != len(data):
                return 400, {"error": f"unexpected shape for input '{name}' for model '{self.name}'"}
            given[name] = data
        missing = [n for n in ("input_ids", "input_lengths", "request_output_len") if n not in given]
        if missing:
            return 400, {"error": f"expected {len(missing)} more inputs for model '{self.name}': {missing}"}
        if given.get("streaming", [False])[0]:
            return 400, {"error": "Streaming is only supported in decoupled mode."}
        if given.get("beam_width", [1])[0] != 1 or given.get("runtime_top_k", [1])[0] != 1:
            return 400, {"error": "this fake decodes greedily only (beam_width 1, runtime_top_k 1)"}
        prompt = given["input_ids"][: given["input_lengths"][0]]
        draft = given.get("draft_input_ids", [])
        new, end = given["request_output_len"][0], given.get("end_id", [None])[0]
        if len(draft) > self.max_draft_len:
            return 400, {"error": f"Draft tokens length ({len(draft)}) exceeds maximum draft tokens length "
                                  f"({self.max_draft_len})."}
        if self.max_seq_len is not None:
            new = min(new, self.max_seq_len - len(prompt) - len(draft))
        out = self.decode(prompt, draft, new, end)
        if not self.exclude:
            out = prompt + out
        return 200, {"model_name": self.name, "model_version": "1", "outputs": [
            {"name": "output_ids", "datatype": "INT32", "shape": [1, 1, len(out)], "data": out},
            {"name": "sequence_length", "datatype": "INT32", "shape": [1, 1], "data": [len(out)]},
        ]}

    def decode(self, prompt: list[int], draft: list[int], new: int, end: int | None) -> list[int]:
        """The tokens generated after `prompt` verifying `draft`: its accepted prefix and the target's
        next token in one step, then one a step."""
        def greedy(context: list[int]) -> int:
            return int(np.argmax(self.lm.logits(context)[: self.lm.real_vocab_size]))

        out: list[int] = []
        accepted = 0
        for d in draft:  # the verification step
            tok = greedy(prompt + out)
            out.append(tok)
            if tok != d:
                break
            accepted += 1
        else:
            out.append(greedy(prompt + out))
        self.accepted.append((accepted, len(draft)))
        while len(out) < new:
            out.append(greedy(prompt + out))
        out = out[:new]
        if end is not None and end in out:
            stop = out.index(end)
            return out[:stop] + [end] * (new - stop) if self.end_in_output else out[:stop]
        return out


def infer_inputs(request: dict) -> dict[str, list]:
    """An infer request's inputs by name, their data."""
    return {t["name"]: t["data"] for t in request["inputs"]}


__all__ = ["FakeTritonServer", "infer_inputs"]
