"""`edgekit models list|pull|path`: the model registry and cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from ._common import print_json

if TYPE_CHECKING:
    from edgekit.models import ModelSpec


def _source(m: ModelSpec) -> str:
    """Where a model comes from: its first package (and an ellipsis for more), or its base."""
    if m.source is None:
        assert m.derive is not None  # a ModelSpec has exactly one of the two
        return "derived from " + m.derive.base
    more = " …" if len(m.source.packages) > 1 else ""
    return ", ".join(f"{n}=={v}" for n, v in m.source.packages[:1]) + more

app = typer.Typer(help="Known models and pairs, and the local cache of their weights.", no_args_is_help=True)


def _names(name: str) -> list[str]:
    from edgekit.models import get_pair, list_pairs

    if name in {p.name for p in list_pairs()}:
        pair = get_pair(name)
        return [pair.draft, pair.target]
    return [name]


@app.command("list")
def list_(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the known pairs and models, and whether each is in the cache."""
    from edgekit.models import cache_dir, is_present, list_models, list_pairs

    pairs: list[dict[str, Any]] = [
        {"name": p.name, "draft": p.draft, "target": p.target, "chat": p.chat, "description": p.description}
        for p in list_pairs()
    ]
    models: list[dict[str, Any]] = [
        {
            "name": m.name,
            "present": is_present(m.name),
            "size": m.size,
            "hidden_size": m.hidden_size,
            "license": m.license,
            "source": _source(m),
        }
        for m in list_models()
    ]
    if json_out:
        print_json({"cache_dir": str(cache_dir()), "pairs": pairs, "models": models})
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="pairs")
    for col in ("pair", "draft", "target", "chat", "description"):
        t.add_column(col)
    for p in pairs:
        t.add_row(p["name"], p["draft"], p["target"], "yes" if p["chat"] else "no", p["description"])
    console.print(t)
    t = Table(title=f"models (cache: {cache_dir()})")
    for col in ("model", "in cache", "size", "license", "source"):
        t.add_column(col)
    for m in models:
        size = f"{m['size'] / 1e6:.0f} MB" if m["size"] else "derived"
        t.add_row(m["name"], "yes" if m["present"] else "no", size, m["license"], m["source"])
    console.print(t)


@app.command("pull")
def pull(
    names: list[str] = typer.Argument(..., help="Pair or model names."),
    force: bool = typer.Option(False, "--force", help="Fetch again even if present and intact."),
) -> None:
    """Download, assemble and check models (a pair name pulls both of its models)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from edgekit.models import pull_model

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=False,
    ) as bars:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=total or None)
            bars.update(tasks[stage], completed=done, total=total or None)

        for name in names:
            for model in _names(name):
                path = pull_model(model, progress=progress, force=force)
                bars.console.print(f"{model}: {path}")


@app.command("path")
def path(name: str = typer.Argument(..., help="Model name.")) -> None:
    """Print the cached file of a model (fails with the pull command if it is missing)."""
    from edgekit.models import model_path

    typer.echo(str(model_path(name)))
