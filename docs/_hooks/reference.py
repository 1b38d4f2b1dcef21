"""MkDocs hook: reference pages written from the code itself, so they cannot drift from it.

- `docs/reference/cli.md` holds `CLI_MARKER`; at build time it is replaced by every command's
  usage, help and options, read from the click command tree that `edgekit.cli.app` builds. A
  renamed option shows up renamed.
- `docs/reference/config.md` holds `REGISTRY_MARKER`; it is replaced by a table of each registry of
  `edgekit.registry` (schedulers, budget policies, drafting policies, engines, transports): a name
  registered shows up.
- `docs/reference/errors.md` holds `ERRORS_MARKER`; it is replaced by `edgekit/errors.py`'s
  docstring (its tree drawn as text) and a mkdocstrings entry for every class of the tree, in the
  tree's order, so a new error class appears without editing the page.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CLI_MARKER = "<!-- edgekit-cli-reference -->"
ERRORS_MARKER = "<!-- edgekit-errors-reference -->"
REGISTRY_MARKER = "<!-- edgekit-registry-reference -->"
ERRORS_SOURCE = Path(__file__).resolve().parents[2] / "edgekit" / "errors.py"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help(command: Any) -> str:
    text = (command.help or "").split("\f")[0]  # click's marker: nothing after it is help
    return "\n".join(line.strip() for line in text.strip().splitlines())


def _is_group(command: Any) -> bool:
    # duck-typed: Typer builds its tree on click, or on its own copy of click (typer._click)
    return hasattr(command, "list_commands")


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    yield command, ctx
    if _is_group(command):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, sub.context_class(sub, info_name=name, parent=ctx))


def _default(param: Any) -> str:
    default = param.default
    if default is None or default is False or default is Ellipsis or default in ("", (), []):
        return ""
    if callable(default):
        return ""
    value = getattr(default, "value", default)  # enums show their value
    return f"`{value}`"


def reference() -> str:
    import typer

    from edgekit.cli.app import app

    root = typer.main.get_command(app)
    out: list[str] = []
    for command, ctx in _commands(root, root.context_class(root, info_name="edgekit")):
        if _is_group(command) and ctx.parent is None:
            out += [_help(command), ""]
            continue
        level = "###" if ctx.parent is not None and ctx.parent.parent is not None else "##"
        pieces = [re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), p) for p in command.collect_usage_pieces(ctx)]
        usage = " ".join([ctx.command_path, *pieces])
        out += [f"{level} {ctx.command_path}", "", _help(command), "", "```text", usage, "```", ""]
        rows = []
        for param in command.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            if param.param_type_name == "argument":
                names = f"`{param.name.upper()}`"
            else:
                names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
            rows.append(f"| {names} | {_cell(getattr(param, 'help', None) or '')} | {_default(param)} |")
        if rows:
            out += ["| argument or option | meaning | default |", "|---|---|---|", *rows, ""]
    return "\n".join(out)


def errors_reference() -> str:
    """The error tree's docstring, with its drawing as a text block (the docstring marks it with
    reStructuredText's `::`, which Markdown does not read), then each class of the tree."""
    module = ast.parse(ERRORS_SOURCE.read_text())
    exported = next(
        ast.literal_eval(node.value)
        for node in module.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
    )
    intro, _, rest = (ast.get_docstring(module) or "").partition("::\n")
    lines = rest.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip())  # the drawing: up to the next blank line
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    drawing = lines[start:end]
    indent = min(len(line) - len(line.lstrip()) for line in drawing)
    drawing = [line[indent:] for line in drawing]
    in_tree = [m.group(1) for line in drawing if (m := re.search(r"(\w+Error)\b", line))]
    order = [name for name in in_tree if name in exported]
    order += sorted(name for name in exported if name not in order and name.endswith("Error"))
    intro = re.sub(r":class:`(\w+)`", r"`\1`", intro.strip()) + ":"
    out = [intro, "", "```text", *drawing, "```", "", "\n".join(lines[end:]).strip(), ""]
    out += [f"::: edgekit.errors.{name}\n    options:\n      heading_level: 2\n" for name in order]
    return "\n".join(out)


def registry_reference() -> str:
    """A table per registry of `edgekit.registry`: the setting that names a policy, and each name
    with what it does, as the registry holds them."""
    from edgekit.registry import BUDGET_POLICIES, DRAFTING, ENGINES, SCHEDULERS, TRANSPORTS

    out = []
    for registry, where in ((SCHEDULERS, "ServerConfig."), (BUDGET_POLICIES, "ServerConfig."),
                            (DRAFTING, "GenerationConfig."), (ENGINES, "ServerConfig."), (TRANSPORTS, "")):
        setting = f"`{where}{registry.setting}`" if where else registry.setting
        out += [f"### {setting}: {registry.kind}", "",
                f"Entry-point group `{registry.group}`.", "", "| name | what it does |", "|---|---|"]
        out += [f"| `{e.name}` | {_cell(e.doc)} |" for e in registry.entries()]
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if REGISTRY_MARKER in markdown:
        markdown = markdown.replace(REGISTRY_MARKER, registry_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, reference())
    if ERRORS_MARKER in markdown:
        markdown = markdown.replace(ERRORS_MARKER, errors_reference())
    return markdown
