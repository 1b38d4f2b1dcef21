"""benchmarks/ as one tool (issue 68, item 3): `python -m benchmarks NAME` runs a benchmark, and the
package's registry (`benchmarks.BENCHMARKS`) is what the README's table, the results pages and the
commands the docs show follow. The benchmarks share a library (`benchmarks.harness`,
`benchmarks.rigs`) and nothing else: no `sys.path` edit, no benchmark reaching into another's
private names or into tests/, no test importing a benchmark (a test runs it, or tests its rig).
Read from the files (ast, text), except the two commands run at the end."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from _paths import ROOT

import benchmarks

BENCH = ROOT / "benchmarks"
RESULTS_PAGES = ROOT / "docs" / "results"
NAMES = {b.name for b in benchmarks.BENCHMARKS}


def _module_path(name: str) -> Path:
    return BENCH.joinpath(*name.split(".")).with_suffix(".py")


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "results" not in p.relative_to(folder).parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in `path`, relative ones resolved against the package."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            out.append((base, [alias.name for alias in node.names]))
    return out


def _benchmarks_imported(module: str, names: list[str]) -> set[str]:
    """The registered benchmarks an import names: `benchmarks.NAME`, `from benchmarks import NAME`."""
    if module.startswith("benchmarks."):
        return {module.removeprefix("benchmarks.")} & NAMES
    if module == "benchmarks":
        return set(names) & NAMES
    if module == "benchmarks.gpu":
        return {f"gpu.{n}" for n in names} & NAMES
    return set()


def test_the_registry_is_every_benchmark_module_and_only_those():
    found = {".".join(p.relative_to(BENCH).with_suffix("").parts)
             for p in [*BENCH.glob("*.py"), *(BENCH / "gpu").glob("*.py")] if not p.name.startswith("__")}
    assert found == NAMES, f"modules without an entry: {found - NAMES}; entries without a module: {NAMES - found}"
    assert len(NAMES) == len(benchmarks.BENCHMARKS), "a name registered twice"
    loose = [p.name for p in [*BENCH.glob("_*.py"), *(BENCH / "gpu").glob("_*.py")] if not p.name.startswith("__")]
    assert not loose, f"shared parts belong in harness/ or rigs/: {loose}"


def test_every_benchmark_has_a_main_reading_its_command_line_through_the_harness():
    """Each benchmark's `main()` reads its command line through the harness (`C.parse`, which applies
    --threads and prints the machine; no ArgumentParser of its own), so that `python -m benchmarks
    NAME ARGS` gives it ARGS as its own command line would."""
    problems = []
    for name in sorted(NAMES):
        tree = ast.parse(_module_path(name).read_text())
        calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        if not any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            problems.append(f"{name}: no main()")
        if "C.parse" not in calls:
            problems.append(f"{name}: its command line is not read by C.parse")
        if {"argparse.ArgumentParser", "ArgumentParser"} & calls:
            problems.append(f"{name}: builds an ArgumentParser of its own (C.arguments)")
    assert not problems, "\n".join(problems)


def _readme_rows() -> dict[str, tuple[str, tuple[str, ...]]]:
    """benchmarks/README.md's table: {name: (what it measures, the results pages it links)}."""
    rows = {}
    for line in (BENCH / "README.md").read_text().splitlines():
        m = re.match(r"^\| `([a-z_.]+)` \| (.*?) \| (.*?) \| .* \|$", line)
        if m:
            assert m[1] not in rows, f"two rows for {m[1]}"
            rows[m[1]] = (m[2], tuple(re.findall(r"\]\(\.\./docs/results/([^)]+)\)", m[3])))
    return rows


def test_the_readme_table_is_the_registry():
    rows = _readme_rows()
    assert set(rows) == NAMES, f"rows without a benchmark: {set(rows) - NAMES}; without a row: {NAMES - set(rows)}"
    assert list(rows) == [b.name for b in benchmarks.BENCHMARKS], "the table in the registry's order"
    for b in benchmarks.BENCHMARKS:
        assert rows[b.name] == (b.summary, b.pages), b.name


def _anchors(page: Path) -> set[str]:
    """The page's heading anchors as the site makes them (lower case, punctuation dropped, hyphens)."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in headings}


def test_every_results_page_the_registry_names_exists():
    missing = []
    for b in benchmarks.BENCHMARKS:
        assert b.pages, f"{b.name}: no results page"
        for page in b.pages:
            path, _, anchor = page.partition("#")
            if not (RESULTS_PAGES / path).is_file():
                missing.append(f"{b.name}: docs/results/{path}")
            elif anchor and anchor not in _anchors(RESULTS_PAGES / path):
                missing.append(f"{b.name}: no heading #{anchor} in docs/results/{path}")
    assert not missing, "\n".join(missing)


def test_no_module_under_benchmarks_edits_sys_path():
    edits = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in _sources(BENCH)
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys"]
    assert not edits, f"sys.path touched (import benchmarks.harness / benchmarks.rigs.* instead): {edits}"


def test_benchmarks_share_only_the_library():
    """A rig or the harness imports no benchmark; a benchmark imports another's public names at most
    (`figures` draws the others' figures with their `plot`); nothing under benchmarks/ imports tests/."""
    helpers = {p.stem for p in (ROOT / "tests").rglob("*.py")}
    problems = []
    for path in _sources(BENCH):
        where = str(path.relative_to(ROOT))
        library = path.relative_to(BENCH).parts[0] in ("harness", "rigs") or path.name.startswith("__")
        for module, names in _imports(path):
            top = module.split(".")[0]
            if top == "tests" or top in helpers:
                problems.append(f"{where}: imports {module} from tests/")
            used = _benchmarks_imported(module, names)
            if used and library:
                problems.append(f"{where}: the library imports the benchmark {sorted(used)}")
            if module.startswith("benchmarks.") and module.removeprefix("benchmarks.") in NAMES:
                private = [n for n in names if n.startswith("_")]
                if private:
                    problems.append(f"{where}: private names of {module}: {private}")
    assert not problems, "\n".join(problems)


def test_no_test_imports_a_benchmark():
    """Tests import the library (`benchmarks.harness`, `benchmarks.rigs.*`) and run a benchmark by its
    name (`benchmarks.run`, `python -m benchmarks NAME`), never import one."""
    problems = [f"{path.relative_to(ROOT)}: imports {sorted(used)}"
                for path in sorted((ROOT / "tests").rglob("*.py"))
                for module, names in _imports(path)
                if (used := _benchmarks_imported(module, names))]
    assert not problems, "\n".join(problems)


def test_every_command_the_docs_show_runs_a_registered_benchmark():
    """`python -m benchmarks NAME` in the READMEs, the docs and the Makefile names a benchmark there
    is, and no page still runs a benchmark by its file (`python benchmarks/NAME.py` needs the path
    edits the package removed)."""
    texts = [ROOT / "README.md", ROOT / "Makefile", *BENCH.rglob("*.md"), *(ROOT / "docs").rglob("*.md"),
             *_sources(BENCH)]
    problems = []
    for path in texts:
        text = path.read_text()
        for name in re.findall(r"python3? -m benchmarks ([a-z_][a-z_.]*)(?![A-Za-z_.])", text):
            if name.rstrip(".") not in NAMES:  # a sentence may end on it
                problems.append(f"{path.relative_to(ROOT)}: python -m benchmarks {name}")
        for old in re.findall(r"python3? benchmarks/[a-z_/]+\.py", text):
            problems.append(f"{path.relative_to(ROOT)}: {old}")
    assert not problems, "\n".join(problems)


def test_the_tool_lists_every_benchmark_and_runs_one_by_its_name():
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line for line in lines if not line.startswith(" ")] == [b.name for b in benchmarks.BENCHMARKS]
    for b in benchmarks.BENCHMARKS:
        pages = lines[lines.index(b.name) + 1:]
        assert next(line for line in pages if line.lstrip().startswith("results: ")).split(": ", 1)[1] == \
            ", ".join(f"docs/results/{page}" for page in b.pages)
    helped = subprocess.run([sys.executable, "-m", "benchmarks", "figures", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: python -m benchmarks figures ")  # its own parser, its own options
    assert "--out" in helped.stdout
    unknown = subprocess.run([sys.executable, "-m", "benchmarks", "fixed-k"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert unknown.returncode == 2 and "did you mean fixed_k" in unknown.stderr
