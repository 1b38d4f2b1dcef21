"""Requantize a GGUF file with llama.cpp; meant to run as a child process.

Usage: python -m edgekit.runtime._quantize SRC DST FTYPE TOKEN_EMBEDDING_TYPE
(e.g. ``... base.gguf draft.gguf Q4_0 Q4_0``). llama.cpp's quantizer may abort
the whole process on bad input, which is why edgekit never calls it in-process.
The output is written to ``DST.partial``, fsync'd, renamed and its directory
fsync'd, so DST is complete or absent, even after a power cut.

Exit status: 0 done, 1 the quantizer failed, 2 bad arguments, 3 llama_cpp missing.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["quantizer_command"]

_NTHREAD = 2


def quantizer_command(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str,
                      token_embedding_type: str) -> list[str]:
    """The command that requantizes SRC into DST in a child process (see the module docstring)."""
    return [sys.executable, "-m", __name__, str(src), str(dst), ftype, token_embedding_type]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, ftype_name, embedding_name = args
    try:
        import llama_cpp
    except ImportError as exc:
        print(f"llama_cpp is not importable: {exc}; reinstall llama-cpp-python", file=sys.stderr)
        return 3
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name.upper()}", None)
    embedding_type = getattr(llama_cpp, f"GGML_TYPE_{embedding_name.upper()}", None)
    if ftype is None or embedding_type is None:
        print(f"unknown llama.cpp type: ftype {ftype_name!r}, token embedding {embedding_name!r}", file=sys.stderr)
        return 2
    if not os.path.isfile(src):
        print(f"no such file: {src}", file=sys.stderr)
        return 2

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = _NTHREAD
    params.ftype = ftype
    # The sources are already quantized; llama.cpp refuses to requantize unless told to.
    params.allow_requantize = True
    params.token_embedding_type = embedding_type

    partial = dst + ".partial"
    llama_cpp.llama_backend_init()
    try:
        status = llama_cpp.llama_model_quantize(src.encode(), partial.encode(), ctypes.byref(params))
        if status != 0:
            print(f"llama_model_quantize returned {status}", file=sys.stderr)
            return 1
        _durable_rename(partial, dst)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return 0


def _durable_rename(partial: str, dst: str) -> None:
    """Without the fsyncs a power cut can leave DST named but holding fewer bytes, or none."""
    _fsync(partial)
    os.replace(partial, dst)
    if os.name == "posix":  # Windows cannot open a directory
        _fsync(os.path.dirname(os.path.abspath(dst)))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
