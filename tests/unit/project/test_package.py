"""The package's shape: its public surface, its one error tree, and its imports
(no cycles between modules nor between packages, lazy imports included; the core
imports neither the facade nor its tooling; no reaching into another package's
private modules; ctypes only in the runtime)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import types
from pathlib import Path
from typing import NamedTuple

from _paths import ROOT

import edgekit
import edgekit.errors

# The card's top-level folders, each installed under the edgekit namespace.
FOLDERS = {
    "edgekit": "edgekit", "models": "edgekit.models", "predictors": "edgekit.predictors",
    "semantic": "edgekit.semantic", "cli": "edgekit.cli",
}

EXPORTED = [
    "ApiError",
    "AsyncConversation", "AsyncEdgeClient", "AsyncGenerationStream", "AuthenticationError", "ChatTemplate",
    "ClientConfig", "ConfidenceThreshold", "ConfigError", "Controller", "Conversation", "Decision",
    "DependencyMissingError", "DraftModel", "DraftOutput", "EdgeClient", "EdgekitError", "Event", "FinalStats",
    "FixedWindow", "GenerationConfig", "GenerationStats", "GenerationStream", "HiddenStateError",
    "IncompatibleModelsError", "InferenceError", "InsufficientMemoryError", "InternalError", "KVCacheFullError",
    "LimitExceededError",
    "LinkEstimator",
    "LinkState", "LlamaDraftModel", "LogitStats", "ModelError", "ModelFetchError", "ModelIntegrityError",
    "ModelLoadError", "ModelNotFoundError", "PredictorController", "PredictorError", "ProbeResult", "ProtocolError",
    "Provisional",
    "Resumed", "RoundEvent", "RoundPlan", "RoundStats", "Sampler", "SemanticHeadError", "ServerConfig",
    "SessionNotFoundError",
    "SpeculativeSession",
    "StaleRoundError", "TextDelta", "VerifierError", "VerifierUnavailableError", "__version__",
]


def test_exported_members():
    """`edgekit.__all__` is what the package exports, and changes only on purpose (httpx's test)."""
    public = {
        name for name in dir(edgekit)
        if not name.startswith("_") and not isinstance(getattr(edgekit, name), types.ModuleType)
    }
    assert public | {"__version__"} == set(edgekit.__all__)
    assert sorted(edgekit.__all__) == sorted(EXPORTED)
    for name in edgekit.__all__:
        assert getattr(edgekit, name) is not None


# -- the error tree ---------------------------------------------------------------------------


def _drawn_tree() -> dict[str, str | None]:
    """Each class in the docstring's drawing, with the class drawn above it."""
    doc = edgekit.errors.__doc__ or ""
    lines = [line for line in doc.splitlines() if re.search(r"(EdgekitError|── )", line)]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        m = re.match(r"^(?P<lead>[\s│├└─]*?)(?P<name>[A-Z]\w+Error)\b", line)
        if not m:
            continue
        depth = len(m.group("lead"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[m.group("name")] = stack[-1][1] if stack else None
        stack.append((depth, m.group("name")))
    return parents


def _edgekit_exceptions() -> set[type]:
    """Every exception class defined in an edgekit module (all of them imported)."""
    for info in pkgutil.walk_packages(edgekit.__path__, "edgekit."):
        importlib.import_module(info.name)
    found = set()
    for name, module in list(__import__("sys").modules.items()):
        if not name.startswith("edgekit"):
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("edgekit"):
                found.add(obj)
    return found


def test_the_error_tree_is_the_one_drawn_and_holds_every_error():
    drawn = _drawn_tree()
    assert next(iter(drawn)) == "EdgekitError" and drawn["EdgekitError"] is None
    defined = _edgekit_exceptions()
    assert {cls.__name__ for cls in defined} == set(drawn), "an error class outside the drawing, or drawn but gone"
    for cls in defined:
        assert issubclass(cls, edgekit.EdgekitError)
        assert cls.__module__ == "edgekit.errors", f"{cls.__name__} is defined in {cls.__module__}"
        edgekit_bases = [b for b in cls.__bases__ if issubclass(b, edgekit.EdgekitError)]
        drawn_parent = drawn[cls.__name__]
        assert [b.__name__ for b in edgekit_bases] == ([drawn_parent] if drawn_parent else []), cls.__name__
        assert cls.__name__ in edgekit.__all__ and cls.__name__ in edgekit.errors.__all__


# -- imports ----------------------------------------------------------------------------------


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


class Import(NamedTuple):
    target: str  # the module imported
    names: list[str]  # the names taken from it (none: the module itself)
    typing_only: bool  # under TYPE_CHECKING: never at run time
    line: int


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import statement's edgekit modules, at the top or inside a function."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(a.name, [], id(node) in typing_only, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules or _compiled(sub):  # `from package import module`
                    found.append(Import(sub, [], id(node) in typing_only, node.lineno))
                else:
                    found.append(Import(base, [alias.name], id(node) in typing_only, node.lineno))
    return [i for i in found if i.target == "edgekit" or i.target.startswith("edgekit.")]


def _compiled(module: str) -> bool:
    """Whether `module` is an extension module of the package (edgekit.runtime._logitstats)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None and not spec.origin.endswith(".py")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for i in _imports(name, path, modules):
            if i.target in modules and i.target != name:
                graph[name].add(i.target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles, as its strongly connected components of more than one node (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles():
    """Between modules, counting imports inside functions too (an import that only
    runs later is still a dependency) and those under TYPE_CHECKING (two modules that
    name each other's types are one idea split in two, or need a seam: a Protocol, as
    `Conversation` asks of its client), but not a package's implicit import of its parents."""
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles: {cycles}"


def _package(module: str) -> str:
    """The node of the package graph a module belongs to: `edgekit` itself (the facade, its
    `__init__`), a subpackage (`edgekit.client`), or a top-level module (`edgekit.errors`)."""
    return ".".join(module.split(".")[:2])


def test_no_client_module_does_more_than_one_job():
    """The client's modules stay small enough to read at one sitting (~350 lines: past that, a
    module has taken on a second job, as `EdgeClient` once had six)."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "edgekit" / "client").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 350} == {}


def test_no_import_cycle_between_packages(tmp_path: Path):
    """The packages import each other in layers, never in a circle, at run time: an edge for every
    import, the lazy ones inside functions included (an import that runs later still needs its
    package to be importable then), not annotations under TYPE_CHECKING, nor a package's implicit
    import of its parents. `edgekit/__init__.py` is a node of its own with its real edges: it is the facade,
    it re-exports the packages below it and so imports them. An edge into it closes a cycle only
    from a package the facade reaches: the core (`test_the_core_never_imports_the_facade` keeps
    that edge out); the tooling above the core (`cli/`, `semantic/`) imports the facade as users
    do, and the facade never imports the tooling."""
    modules = _modules()
    # an import inside a function is an edge; a relative one is resolved from its package
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from ..verifier import VerifierServer\n")
    assert [i.target for i in _imports("edgekit.client.lazy", lazy, modules)] == ["edgekit.verifier"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

    nodes = {_package(m) for m in modules}
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    where: dict[tuple[str, str], dict[str, None]] = {}  # each edge's import statements, in order
    for name, path in modules.items():
        for i in _imports(name, path, modules):
            edge = (_package(name), _package(i.target))
            if i.typing_only or edge[1] not in nodes or edge[0] == edge[1]:
                continue
            graph[edge[0]].add(edge[1])
            where.setdefault(edge, {})[f"{path.relative_to(ROOT)}:{i.line} imports {i.target}"] = None
    assert {"edgekit", "edgekit.client", "edgekit.verifier", "edgekit.errors", "edgekit.cli"} <= nodes
    found = []
    for cycle in _cycles(graph):
        found.append(f"{', '.join(cycle)} import each other:")
        found += [f"  {a} -> {b}: {line}" for (a, b), lines in sorted(where.items())
                  if a in cycle and b in cycle for line in lines]
    assert not found, "import cycles between packages:\n" + "\n".join(found)


def test_the_core_never_imports_the_facade():
    """No module of the core imports from `edgekit` itself (the facade of `edgekit/__init__.py`),
    lazily or not: the facade imports the core to re-export it, so such an import is a cycle, or one
    as soon as the facade re-exports that package. The core imports a name from the package that
    defines it; the tooling (`cli/`, `semantic/`, `predictors/`) may use the facade."""
    modules = _modules()
    found = [
        f"{path.relative_to(ROOT)}:{i.line} imports {', '.join(i.names) or 'edgekit'} from the facade"
        for name, path in modules.items()
        if name != "edgekit" and not name.startswith(_TOOLING)
        for i in _imports(name, path, modules)
        if i.target == "edgekit" and not i.typing_only
    ]
    assert not found, "\n".join(found)


def _private_owner(module: str) -> str | None:
    """The package whose private module `module` is (None: not private)."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_no_module_imports_another_packages_private_module():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        for target, names, _, _ in _imports(name, path, modules):
            owner = _private_owner(target)
            if owner is not None and not (name == owner or name.startswith(owner + ".")):
                wrong.append(f"{name} imports {target}")
            private_names = [n for n in names if n.startswith("_") and not n.startswith("__")]
            home = target if modules.get(target, Path()).name == "__init__.py" else target.rpartition(".")[0]
            if private_names and target in modules and not (name == home or name.startswith(home + ".")):
                wrong.append(f"{name} imports {private_names} from {target}")
    assert not wrong, "\n".join(wrong)


def test_only_the_runtime_touches_ctypes_and_llama_cpp():
    modules = _modules()
    users = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] in ("ctypes", "llama_cpp") for n in names):
                users.append(name)
    assert users and all(u.startswith("edgekit.runtime.") for u in users), users



_TOOLING = ("edgekit.predictors", "edgekit.semantic", "edgekit.cli")


def _tooling_imports(source: str, package: tuple[str, ...]) -> list[str]:
    """The tooling modules `source` (a module of `package`) imports, anywhere in it."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            names = [".".join([*base, *(node.module.split(".") if node.module else [])])]
            names += [f"{names[0]}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names if any(n == t or n.startswith(t + ".") for t in _TOOLING)]
    return found


def test_the_core_never_imports_its_tooling():
    """`predictors/`, `semantic/` and `cli/` (installed as edgekit.predictors, edgekit.semantic,
    edgekit.cli) import the core; no module of the core (`edgekit/`) imports them, at its top or
    inside a function (a lazy import is an import too)."""

    # the check sees both spellings of such an import, and not the core's own client package
    assert _tooling_imports("def f():\n    from ..semantic.shipped import SHIPPED_DIR\n", ("edgekit", "client"))
    assert _tooling_imports("import edgekit.predictors.train\n", ("edgekit",))
    assert not _tooling_imports("from .client import EdgeClient\nfrom . import cli_tools\n", ("edgekit",))
    core = ROOT / "edgekit"
    found = []
    for path in sorted(core.rglob("*.py")):
        parts = path.relative_to(core.parent).with_suffix("").parts
        package = parts[:-1]  # a module's package; an __init__'s is its own folder
        found += [f"{path.relative_to(core.parent)}:{hit}" for hit in _tooling_imports(path.read_text(), package)]
    assert not found, "\n".join(found)


def test_every_public_class_and_function_of_edgekit_has_a_docstring_of_its_own():
    """The API reference is generated from them (issue 39): a dataclass's generated signature is no docstring."""
    import dataclasses
    import inspect

    import edgekit

    missing = []
    for name in edgekit.__all__:
        obj = getattr(edgekit, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        doc = (obj.__doc__ or "").strip()
        if not doc or (dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}(")):
            missing.append(name)
    assert not missing, f"no docstring: {missing}"

