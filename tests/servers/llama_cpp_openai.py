"""llama-cpp-python's own OpenAI-compatible server, set up for reproducible numerics.

Stock but for two llama.cpp parameters its CLI does not expose, set here as
edgekit's exact-numerics verifier sets them (with `--flash_attn true` on the
command line): weights kept in their file layout (no repacking) and a full-size
SWA KV cache. With the defaults, the same prompt got logits that depended on
which requests came before it (a 0.1 nat swing at one position, enough to flip a
greedy choice): llama.cpp's CPU kernels, and so the last bits of every logit,
change with the number of rows a batch evaluates. The server is otherwise
unchanged. (Its default repeat_penalty of 1.1, which makes temperature 0 differ
from the argmax, is turned off per request by the transport.)

    python tests/servers/llama_cpp_openai.py --model M.gguf --port P --flash_attn true ...
"""

import functools

import llama_cpp
import llama_cpp.llama_cpp as lc

_defaults = lc.llama_model_default_params


def _model_params():  # type: ignore[no-untyped-def]
    params = _defaults()
    params.use_extra_bufts = False  # no weight repacking: batch-size-independent matmul kernels
    return params


lc.llama_model_default_params = _model_params

_init = llama_cpp.Llama.__init__


@functools.wraps(_init)
def _init_swa_full(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    kwargs.setdefault("swa_full", True)
    _init(self, *args, **kwargs)


llama_cpp.Llama.__init__ = _init_swa_full

if __name__ == "__main__":
    from llama_cpp.server.__main__ import main

    main()
