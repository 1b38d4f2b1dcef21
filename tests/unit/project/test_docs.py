"""The documentation site (mkdocs.yml, docs/) and the README: the site builds with --strict, every
`edgekit` command a page or the README shows exists and takes the options it is shown with, and every
relative link of the README (which GitHub renders, and no build checks) points to a file that exists.

A command is a line of a fenced code block that starts with `edgekit ` (or `$ edgekit `, or after
`VAR=value` assignments), joined with the lines its trailing backslashes continue. Its command path
must exist in the Typer app, its `--help` must parse, and every option it uses must be one that help
lists, so a renamed or removed flag fails here instead of in a reader's shell.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import typer
from _paths import ROOT
from typer.testing import CliRunner

from edgekit.cli.app import app

DOCS = ROOT / "docs"
README = ROOT / "README.md"
FENCE = re.compile(r"^\s*(```|~~~)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*\s+")


def shown_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) for every `edgekit` command in the fenced code blocks of `text`."""
    found: list[tuple[int, str]] = []
    in_code = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_code = not in_code
            pending = None
            continue
        if not in_code:
            continue
        if pending is not None:  # a continuation of the command above
            start, command = pending
            command += " " + line.strip()
        else:
            start, command = number, line.strip().removeprefix("$ ")
            while ASSIGNMENT.match(command):
                command = ASSIGNMENT.sub("", command, count=1)
            if not command.startswith("edgekit "):
                continue
        if command.endswith("\\"):
            pending = (start, command[:-1].rstrip())
            continue
        pending = None
        found.append((start, command))
    return found


def _shown_commands() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(ROOT)}:{number}", command)
        for page in [README, *sorted(DOCS.rglob("*.md"))]
        for number, command in shown_commands(page.read_text())
    ]


SHOWN = _shown_commands()


@cache
def _help(path: tuple[str, ...]) -> tuple[int, str]:
    # a wide terminal, so that rich does not fold an option's name
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250", "NO_COLOR": "1"})
    return result.exit_code, result.output


def command_problems(command: str) -> list[str]:
    """What is wrong with `command` against this CLI: [] when it would parse."""
    words = shlex.split(command, comments=True)
    if words[:1] != ["edgekit"]:
        return [f"not an edgekit command: {command!r}"]
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="edgekit")
    current, path, rest = root, [], words[1:]
    while hasattr(current, "list_commands") and rest and not rest[0].startswith("-"):
        sub = current.get_command(ctx, rest[0])
        if sub is None:
            return [f"no command `edgekit {' '.join([*path, rest[0]])}`"]
        path.append(rest.pop(0))
        current, ctx = sub, sub.context_class(sub, info_name=path[-1], parent=ctx)
    shown = f"`edgekit {' '.join(path)}`"
    if hasattr(current, "list_commands") and path:
        return [f"{shown} is a group of commands: name one of them"]
    code, helptext = _help(tuple(path))
    if code != 0:
        return [f"{shown} --help exited with {code}: {helptext[-500:]}"]
    listed = {
        opt
        for param in current.get_params(ctx)
        if param.param_type_name == "option" and not getattr(param, "hidden", False)
        for opt in [*param.opts, *param.secondary_opts]
    }
    problems = []
    for word in rest:
        if word.startswith("--"):
            option = word.split("=", 1)[0]
        elif re.fullmatch(r"-[A-Za-z]", word):
            option = word
        else:
            continue
        if option not in listed or option not in helptext:
            problems.append(f"{shown} takes no option {option} (its --help lists {', '.join(sorted(listed))})")
    return problems


def test_the_site_builds_with_strict(tmp_path):
    """Broken links and anchors, pages left out of the navigation and references mkdocstrings cannot
    resolve are warnings, and --strict makes any warning fail the build (mkdocs.yml, `validation`)."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-8000:]}"
    # the pages written from the code at build time (docs/_hooks/reference.py) and by mkdocstrings
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert 'id="edgekit-serve"' in cli and "--max-sessions" in cli
    assert 'id="edgekit.errors.StaleRoundError"' in (site / "reference" / "errors" / "index.html").read_text()
    assert 'id="edgekit.EdgeClient"' in (site / "reference" / "client" / "index.html").read_text()
    # the figures come from benchmarks/results through docs/figures
    assert (site / "figures" / "side_by_side_gemma-270m.png").is_file()
    assert not list((site / "figures").glob("*.json"))


def test_the_guides_show_commands():
    """The extraction finds what the pages show; an extraction that found nothing would pass the
    check below vacuously."""
    assert len(SHOWN) >= 40
    subcommands = {shlex.split(command, comments=True)[1] for _, command in SHOWN}
    assert {"chat", "generate", "serve", "api", "models", "probe", "plan", "predictor", "semantic"} <= subcommands
    in_readme = {shlex.split(command, comments=True)[1] for where, command in SHOWN if where.startswith("README.md:")}
    assert {"chat", "serve"} <= in_readme


@pytest.mark.parametrize(("where", "command"), SHOWN, ids=[where for where, _ in SHOWN])
def test_every_command_shown_exists(where, command):
    assert command_problems(command) == [], where


def test_the_extraction_reads_code_blocks_only():
    text = "\n".join([
        "edgekit chat --prose-is-not-checked",
        "```sh",
        "$ edgekit chat --verifier 10.0.0.5:50551   # a comment --not-an-option",
        "EDGEKIT_THREADS=1 edgekit generate --pair gemma-270m \\",
        '    --prompt "def f(x):" --json',
        "python benchmarks/fixed_k.py --k 4",
        "```",
    ])
    assert shown_commands(text) == [
        (3, "edgekit chat --verifier 10.0.0.5:50551   # a comment --not-an-option"),
        (4, 'edgekit generate --pair gemma-270m --prompt "def f(x):" --json'),
    ]
    assert [command_problems(command) for _, command in shown_commands(text)] == [[], []]


def test_a_made_up_flag_or_command_is_caught():
    """The negative control: the check fails where a reader's shell would."""
    assert command_problems("edgekit models pull gemma-270m --force") == []
    flagged = command_problems("edgekit chat --verifier 10.0.0.5:50551 --no-such-flag")
    assert len(flagged) == 1 and "--no-such-flag" in flagged[0]
    assert "-z" in command_problems("edgekit generate -z")[0]
    assert command_problems("edgekit chatt --json") == ["no command `edgekit chatt`"]
    assert command_problems("edgekit models fetch gemma-270m") == ["no command `edgekit models fetch`"]
    assert "group" in command_problems("edgekit predictor --json")[0]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _outside_code(text: str) -> list[str]:
    """The lines of `text` outside its fenced code blocks."""
    lines, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            lines.append(line)
    return lines


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`: lower case, punctuation dropped, spaces to hyphens."""
    headings = [line.lstrip("#").strip() for line in _outside_code(page.read_text()) if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def link_problems(page: Path) -> list[str]:
    """Each relative link of `page` whose file does not exist, or whose anchor is no heading of it."""
    problems = []
    for line in _outside_code(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                problems.append(f"{target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                problems.append(f"{target}: no heading #{anchor} in {path or page.name}")
    return problems


def test_every_relative_link_of_the_readme_resolves():
    links = [target for line in _outside_code(README.read_text()) for target in LINK.findall(line)]
    assert len(links) >= 20 and any(target.startswith("docs/") for target in links)
    assert link_problems(README) == []


def test_a_broken_readme_link_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## What it says\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "README.md"
    page.write_text("\n".join([
        "[ok](docs/page.md) [ok](docs/page.md#what-it-says) [ok](https://example.org/x) [ok](#a-readme)",
        "# A readme",
        "[gone](docs/gone.md) [no anchor](docs/page.md#not-a-heading)",
        "```sh",
        "[in code](docs/gone.md)",
        "```",
    ]))
    assert link_problems(page) == [
        "docs/gone.md: no such file",
        "docs/page.md#not-a-heading: no heading #not-a-heading in docs/page.md",
    ]
