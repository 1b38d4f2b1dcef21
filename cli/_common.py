"""Options and helpers shared by several commands."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

PAIR_HELP = "Draft/target pair from the model registry (see `edgekit models list`)."
VERIFIER_HELP = (
    "Verifier address HOST:PORT (or grpc://HOST:PORT). Without it, the pair's target is "
    "started as a verifier on a free loopback port in this process."
)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def note(message: str) -> None:
    """A diagnostic line on stderr, so stdout stays clean for --json."""
    typer.echo(message, err=True)
