"""`edgekit models list|pull|rm|path`: models from the registry, the Hugging Face Hub and Ollama's store.

Any command that takes a model takes a reference (`edgekit.models.refs`): a registry name,
hf:ORG/REPO[:QUANT], hf:ORG/REPO/FILE.gguf, ollama:NAME[:TAG] or a path. `list` shows every model
on this machine, from every source, with its tokenizer and the models it can draft for."""

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

app = typer.Typer(
    help="Models on this machine (registry cache, Hugging Face cache, Ollama's store), pulling and removing them.",
    no_args_is_help=True,
)


def _names(name: str) -> list[str]:
    from edgekit.models import get_pair, list_pairs

    if name in {p.name for p in list_pairs()}:
        pair = get_pair(name)
        return [pair.draft, pair.target]
    return [name]


@app.command("list")
def list_(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the registry's pairs and models, and every model on this machine: edgekit's cache, the
    Hugging Face cache and Ollama's store, with its tokenizer and the larger models it can draft for."""
    from edgekit.models import cache_dir, is_present, list_models, list_pairs
    from edgekit.models.inventory import can_draft_for, local_models

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
    found = local_models()
    local: list[dict[str, Any]] = [
        {
            "ref": m.ref,
            "source": m.source,
            "path": str(m.path),
            "size": m.size,
            "quant": m.quant,
            "tokenizer": m.tokenizer_kind,
            "drafts_for": [t.ref for t in found if can_draft_for(m, t)],
        }
        for m in found
    ]
    if json_out:
        print_json({"cache_dir": str(cache_dir()), "pairs": pairs, "models": models, "local": local})
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
    t = Table(title=f"registry models (cache: {cache_dir()})")
    for col in ("model", "in cache", "size", "license", "source"):
        t.add_column(col)
    for m in models:
        size = f"{m['size'] / 1e6:.0f} MB" if m["size"] else "derived"
        t.add_row(m["name"], "yes" if m["present"] else "no", size, m["license"], m["source"])
    console.print(t)
    t = Table(title="on this machine (name any of them with --draft, --target or --model)")
    for col in ("reference", "size", "quant", "tokenizer", "drafts for"):
        t.add_column(col)
    for m in local:
        t.add_row(m["ref"], f"{m['size'] / 1e6:.0f} MB", m["quant"], m["tokenizer"] or "unreadable",
                  ", ".join(m["drafts_for"]) or "-")
    console.print(t)


@app.command("pull")
def pull(
    refs: list[str] = typer.Argument(
        ..., help="Pairs or models: registry names, hf:ORG/REPO[:QUANT], hf:ORG/REPO/FILE.gguf."
    ),
    force: bool = typer.Option(False, "--force", help="Registry models: fetch again even if present and intact."),
) -> None:
    """Download and check models: a registry pair or model (a pair pulls both of its models), or a model on
    the Hugging Face Hub (into its cache, sha256-checked). Ollama's models are Ollama's to pull."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from edgekit.errors import ConfigError
    from edgekit.models import pull_model
    from edgekit.models.refs import parse_ref, resolve

    parsed = [parse_ref(r) for r in refs]  # every reference checked before anything is fetched
    for ref in parsed:
        if ref.kind == "ollama":
            raise ConfigError(f"{ref}: Ollama's store is Ollama's to fill (ollama pull {ref.ollama_name}); "
                              "edgekit reads its models in place")
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

        for ref in parsed:
            if ref.kind == "registry":
                assert ref.name is not None
                for model in _names(ref.name):
                    path = pull_model(model, progress=progress, force=force)
                    bars.console.print(f"{model}: {path}")
            else:  # the Hub (its own progress bars), or a file already here
                resolved = resolve(ref)
                bars.console.print(f"{ref}: {resolved.path}")


@app.command("rm")
def rm(refs: list[str] = typer.Argument(..., help="Registry models or pairs, or hf: references.")) -> None:
    """Remove models from edgekit's cache or the Hugging Face cache (Ollama's models: `ollama rm`;
    your own files: yours to delete)."""
    from edgekit.errors import ConfigError
    from edgekit.models.refs import parse_ref

    parsed = [parse_ref(r) for r in refs]
    for ref in parsed:
        if ref.kind in ("ollama", "path"):
            how = f"ollama rm {ref.ollama_name}" if ref.kind == "ollama" else "delete it yourself"
            raise ConfigError(f"{ref}: not edgekit's to remove ({how})")
    from edgekit.models.remove import remove

    for ref in parsed:
        for line in remove(ref):
            typer.echo(line)


@app.command("path")
def path(name: str = typer.Argument(..., help="Model name.")) -> None:
    """Print the cached file of a model (fails with the pull command if it is missing)."""
    from edgekit.models import model_path

    typer.echo(str(model_path(name)))
