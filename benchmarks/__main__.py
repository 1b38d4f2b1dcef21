"""`python -m benchmarks NAME [ARGS...]` runs a benchmark with its own command line (`NAME --help`);
`python -m benchmarks --list` names every one, what it measures and its results pages."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence

from benchmarks import BENCHMARKS, find, run

USAGE = "usage: python -m benchmarks NAME [ARGS...]   (NAME --help: its options)\n       python -m benchmarks --list"


def listing() -> str:
    """Every benchmark: its name, what it measures, and its results pages (under docs/results/)."""
    out = []
    for b in BENCHMARKS:
        out.append(b.name)
        out.extend(textwrap.wrap(b.summary, 100, initial_indent="    ", subsequent_indent="    ",
                                 break_on_hyphens=False))
        out.append("    results: " + ", ".join(f"docs/results/{page}" for page in b.pages))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE + "\n\nbenchmarks: " + ", ".join(b.name for b in BENCHMARKS))
        return 0 if args else 2
    if args[0] == "--list":
        print(listing())
        return 0
    try:
        find(args[0])
    except KeyError as e:
        print(f"{USAGE}\n{e.args[0]}", file=sys.stderr)
        return 2
    run(args[0], args[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
