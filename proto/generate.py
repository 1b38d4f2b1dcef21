"""Regenerate the Python code for edgekit.verifier.v1 from proto/verifier.proto.

    python proto/generate.py            # writes edgekit/protocol/_pb/
    python proto/generate.py --out DIR  # writes DIR/ (the test compares the two)

The generated modules are committed; tests/unit/protocol/test_proto.py checks that
regenerating them changes nothing. Needs grpcio-tools (the `test` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "edgekit" / "protocol" / "_pb"
GENERATED = ("verifier_pb2.py", "verifier_pb2.pyi", "verifier_pb2_grpc.py")


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    # The virtual include path makes the generated grpc module import
    # `from edgekit.protocol._pb import verifier_pb2` regardless of where it is written.
    args = [
        "protoc",
        f"-Iedgekit/protocol/_pb={HERE}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        "edgekit/protocol/_pb/verifier.proto",
    ]
    tmp = out / "_gen"
    args = [a.replace(f"={out}", f"={tmp}") for a in args]
    tmp.mkdir(exist_ok=True)
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = []
    for name in GENERATED:
        src = tmp / "edgekit" / "protocol" / "_pb" / name
        dst = out / name
        dst.write_bytes(src.read_bytes())
        written.append(dst)
    _rmtree(tmp)
    return written


def _rmtree(path: Path) -> None:
    for child in sorted(path.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ns = parser.parse_args(argv)
    for path in generate(ns.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
