"""The import graph, read statically (``ast``; nothing is imported): no cycles, and BUILD's deps are the imports.

Every ``import x`` / ``from x import y`` counts, at any nesting level: a lazy import inside a function is still
an arrow. ``from realm_tf.tasks import open_qa`` is an arrow to the module ``realm_tf.tasks.open_qa`` when that
is a module, else to the package; in general an import names the longest dotted prefix that is a module of
``realm_tf/`` or ``beam_jobs/``. Dynamic imports (``importlib.import_module``) are not arrows: write imports as
statements so that they are seen here.
"""
from __future__ import annotations

import ast
import collections
import pathlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("realm_tf", "beam_jobs")
LIBRARY_KINDS = ("py_library", "py_binary")

# Import name (a dotted prefix) -> the @pypi// name, where the two differ; otherwise the top-level import name
# is the pypi name (tensorflow, numpy, tf_keras, apache_beam, scann, tensorflow_text, tqdm, safetensors, ...).
PYPI_NAMES = {
    "official": "tf_models_official",
    "yaml": "pyyaml",
    "google.protobuf": "protobuf",
    "tensorflow_serving": "tensorflow_serving_api",
}

Graph = Mapping[str, Iterable[str]]


# ---- reading the sources ----------------------------------------------------------------------------------------

def module_name(path: pathlib.Path, root: pathlib.Path = REPO) -> str:
    """``realm_tf/data/x.py`` -> ``realm_tf.data.x``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: pathlib.Path = REPO, packages: Sequence[str] = PACKAGES) -> dict[str, pathlib.Path]:
    """Every module of ``packages`` under ``root``, by dotted name."""
    return {module_name(p, root): p for d in packages for p in sorted((root / d).rglob("*.py"))}


def imported_names(path: pathlib.Path, module: str | None = None) -> list[tuple[str, bool]]:
    """The dotted names ``path`` imports, anywhere in the file, as ``(name, absolute)``.

    ``import a.b`` gives ``a.b``; ``from a.b import c`` gives ``a.b.c`` (resolved later to ``a.b.c`` or ``a.b``);
    a relative import is made absolute from ``module`` (the importing module's dotted name; a package's name for
    its ``__init__.py``) and reported with ``absolute=False``. A string constant assigned to a name that parses
    as Python with imports is a script the file runs (``python -c SCRIPT``): its imports count too.
    """
    return _tree_imports(ast.parse(path.read_text(encoding="utf-8"), str(path)), module,
                         path.name == "__init__.py", str(path))


def _tree_imports(tree: ast.AST, module: str | None, is_package: bool, where: str) -> list[tuple[str, bool]]:
    names: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend((alias.name, True) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if module is None:
                    raise ValueError(f"{where}: relative import without a module name")
                package = module.split(".")
                if not is_package:
                    package.pop()
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module
            if base == "__future__":
                continue
            names.extend((f"{base}.{alias.name}" if alias.name != "*" else base, not node.level)
                         for alias in node.names)
        elif (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)):
            try:
                script = ast.parse(node.value.value)
            except SyntaxError:
                continue
            names.extend(_tree_imports(script, None, False, f"{where}: script at line {node.lineno}"))
    return names


def resolve(name: str, modules: Iterable[str]) -> str | None:
    """The longest dotted prefix of ``name`` that is one of ``modules``, or None."""
    modules = set(modules)
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def pypi_name(name: str) -> str:
    """The @pypi// package providing the imported dotted ``name``."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in PYPI_NAMES:
            return PYPI_NAMES[".".join(parts[:end])]
    return parts[0]


def file_imports(path: pathlib.Path, modules: Iterable[str], module: str | None = None,
                 ) -> tuple[set[str], set[str]]:
    """``(internal modules, @pypi names)`` imported by ``path``; the standard library is left out."""
    modules = set(modules)
    internal, external = set(), set()
    for name, absolute in imported_names(path, module):
        target = resolve(name, modules)
        if target is not None:
            internal.add(target)
        elif absolute and name.split(".")[0] not in sys.stdlib_module_names:
            external.add(pypi_name(name))
    return internal, external


def import_graph(modules: Mapping[str, pathlib.Path]) -> dict[str, set[str]]:
    """``module -> the modules it imports`` over ``modules`` (name -> path)."""
    return {name: file_imports(path, modules, name)[0] for name, path in modules.items()}


# ---- cycles ---------------------------------------------------------------------------------------------------

def strongly_connected_components(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative), each sorted; nodes only named as
    targets count as nodes too."""
    succ = {n: sorted(set(graph.get(n, ()))) for n in set(graph) | {t for ts in graph.values() for t in ts}}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(succ[node]):
                work.append((node, i + 1))
                nxt = succ[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycles(graph: Graph) -> list[tuple[list[str], list[str]]]:
    """The import cycles of ``graph``: ``(component, path)`` for every strongly connected component with more than
    one module or a self-loop; ``path`` is the shortest cycle ``[a, b, ..., a]`` from its first module back to it."""
    found = []
    for component in strongly_connected_components(graph):
        start = component[0]
        if len(component) == 1 and start not in set(graph.get(start, ())):
            continue
        members = set(component)
        previous: dict[str, str] = {}
        frontier = collections.deque([start])
        while frontier and start not in previous:
            node = frontier.popleft()
            for nxt in sorted(set(graph.get(node, ())) & members):
                if nxt not in previous:
                    previous[nxt] = node
                    frontier.append(nxt)
        path = [start]
        node = previous[start]
        while node != start:
            path.append(node)
            node = previous[node]
        found.append((component, [start, *reversed(path[1:]), start]))
    return sorted(found)


# ---- BUILD ----------------------------------------------------------------------------------------------------

def build_rules(build: pathlib.Path = REPO / "BUILD") -> list[tuple[str, dict[str, Any]]]:
    """``(kind, attributes)`` of every rule in the Bazel ``BUILD`` file (executed as Python, as in test_build)."""
    rules: list[tuple[str, dict[str, Any]]] = []

    def rule(kind: str) -> Callable[..., None]:
        return lambda **kw: rules.append((kind, kw))

    namespace = {"load": lambda *a, **k: None, "package": lambda **k: None,
                 **{kind: rule(kind) for kind in ("py_library", "py_test", "py_binary")}}
    exec(compile(build.read_text(encoding="utf-8"), str(build), "exec"), namespace)  # pylint: disable=exec-used
    return rules


def libraries_by_module(rules: Sequence[tuple[str, Mapping[str, Any]]], root: pathlib.Path = REPO,
                        packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """``module -> the name of the library target whose srcs hold it``, for the modules of ``packages``."""
    return {module_name(root / src, root): kw["name"] for kind, kw in rules if kind in LIBRARY_KINDS
            for src in kw["srcs"] if src.split("/")[0] in packages and src.endswith(".py")}


def dep_problems(kind: str, rule: Mapping[str, Any], modules: Iterable[str], libraries: Mapping[str, str],
                 root: pathlib.Path = REPO) -> list[str]:
    """What is wrong with one rule's deps: internal deps other than the libraries of the modules its srcs import,
    imported third-party packages without an ``@pypi//`` dep, ``@pypi//`` deps nothing imports. Empty if none."""
    modules = set(modules)
    own = {module_name(root / src, root) for src in rule["srcs"]} if kind in LIBRARY_KINDS else set()
    internal, external = set(), set()
    for src in rule["srcs"]:
        path = root / src
        mod_int, mod_ext = file_imports(path, modules, module_name(path, root) if kind in LIBRARY_KINDS else None)
        internal |= mod_int
        external |= mod_ext
    internal -= own
    external -= {pathlib.Path(src).stem for src in rule["srcs"]}  # a test's helper module next to it, in its srcs
    unprovided = sorted(m for m in internal if m not in libraries)
    wanted = {f":{libraries[m]}" for m in internal if m in libraries}
    internal_targets = {f":{name}" for name in libraries.values()}
    deps = set(rule.get("deps", []))
    declared = deps & internal_targets
    wanted |= {f"@pypi//{name}" for name in external}
    declared |= {dep for dep in deps if dep.startswith("@pypi//")}
    problems = []
    if wanted - declared:
        problems.append(f"missing deps {_as_list(wanted - declared)}")
    if declared - wanted:
        problems.append(f"extra deps (not imported) {_as_list(declared - wanted)}")
    if unprovided:
        problems.append(f"imports modules no py_library provides: {unprovided}")
    return [f"{kind}(name = \"{rule['name']}\", srcs = {rule['srcs']}): {'; '.join(problems)}"] if problems else []


def _as_list(deps: Iterable[str]) -> str:
    """``deps`` as a BUILD list, to paste."""
    return "[" + ", ".join(f'"{dep}"' for dep in sorted(deps)) + "]"


def _problems(kinds: Sequence[str], select: Callable[[Mapping[str, Any]], bool]) -> list[str]:
    """``dep_problems`` of the BUILD rules of ``kinds`` that ``select`` picks."""
    rules = build_rules()
    modules = find_modules()
    libraries = libraries_by_module(rules)
    return [problem for kind, kw in rules if kind in kinds and select(kw)
            for problem in dep_problems(kind, kw, modules, libraries)]


# ---- the tree -------------------------------------------------------------------------------------------------

def test_no_import_cycles():
    found = cycles(import_graph(find_modules()))
    assert not found, "import cycles (a lazy import inside a function is still an arrow):\n" + "\n".join(
        f"{' -> '.join(path)}   (modules in the cycle: {', '.join(component)})" for component, path in found)


# The parts of realm_tf, lowest first: a module may import only from its own part or from parts below it
# (docs/architecture.md). beam_jobs sit beside the package and use it; the package reaches them only from
# its entry points (cli) and from the index builder, which runs embed_blocks.
PARTS = ("errors", "resources", "library_logs", "process_settings", "config", "artifacts", "layers", "data", "networks", "models",
         "index", "serving", "tasks", "demo", "cli")
MAY_IMPORT_BEAM_JOBS = ("realm_tf.cli", "realm_tf.index.index_refresher")


def layer_violations(modules: Mapping[str, pathlib.Path], parts: Sequence[str] = PARTS) -> list[str]:
    """``a -> b`` for every import from a part of realm_tf to a part above it (or to beam_jobs)."""
    rank = {part: i for i, part in enumerate(parts)}
    found = []
    for module, path in modules.items():
        if not module.startswith("realm_tf."):
            continue
        here = module.split(".")[1]
        assert here in rank, f"{module}: realm_tf.{here} is not one of the parts {parts}"
        internal, _ = file_imports(path, modules, module)
        for target in sorted(internal):
            if target.startswith("beam_jobs"):
                if module not in MAY_IMPORT_BEAM_JOBS:
                    found.append(f"{module} -> {target}")
            elif target.count(".") and rank[target.split(".")[1]] > rank[here]:
                found.append(f"{module} -> {target}")
    return found


def test_imports_run_down_the_parts_of_the_package():
    found = layer_violations(find_modules())
    assert not found, f"imports that run up the parts {' < '.join(PARTS)}:\n" + "\n".join(found)


def test_layer_violations_finds_an_arrow_up(tmp_path):
    _write(tmp_path, {"realm_tf/__init__.py": "", "realm_tf/data/__init__.py": "", "realm_tf/tasks/__init__.py": "",
                      "realm_tf/data/a.py": "from realm_tf.tasks import b\n",
                      "realm_tf/tasks/b.py": "from realm_tf.data import a\n"})
    assert layer_violations(find_modules(tmp_path, ("realm_tf",))) == ["realm_tf.data.a -> realm_tf.tasks.b"]


def test_library_deps_are_the_imports():
    problems = _problems(LIBRARY_KINDS, lambda kw: any(s.split("/")[0] in PACKAGES for s in kw["srcs"]))
    assert not problems, "BUILD deps differ from the imports:\n" + "\n".join(problems)


def test_test_deps_are_the_imports():
    problems = _problems(("py_test",), lambda kw: True)
    assert not problems, "BUILD deps differ from the imports:\n" + "\n".join(problems)


# ---- the checks themselves, on synthetic graphs and trees ------------------------------------------------------

def test_cycles_finds_every_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "s": {"s"}, "x": {"y"}, "y": {"x"}}
    assert cycles(graph) == [(["a", "b", "c"], ["a", "b", "c", "a"]), (["s"], ["s", "s"]),
                             (["x", "y"], ["x", "y", "x"])]
    assert cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [(["a", "b", "c"], ["a", "b", "a"])]
    assert not cycles({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}})
    long_chain = {str(i): {str(i + 1)} for i in range(5000)}  # deep graphs do not hit the recursion limit
    assert not cycles(long_chain)
    ((component, path),) = cycles({**long_chain, "5000": {"0"}})
    assert len(component) == 5001 and path[0] == path[-1] == "0" and len(path) == 5002


def _write(root: pathlib.Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def test_graph_counts_lazy_relative_and_package_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from pkg import base\n",
        "pkg/base.py": "import os\n\ndef make():\n    from pkg.sub import impl  # lazy\n    return impl\n",
        "pkg/sub/impl.py": "from pkg.base import make\nfrom . import other\nimport numpy as np\n",
        "pkg/sub/other.py": "from .. import base\nfrom pkg.base import make\nimport yaml, official.nlp\n",
        "pkg/tool.py": ("if True:\n    from pkg.sub import missing_name\nimport pkg\n"
                        "SCRIPT = 'import tqdm\\nfrom pkg import base'\nTEXT = 'not python: from pkg import'\n"),
    })
    modules = find_modules(tmp_path, ["pkg"])
    assert set(modules) == {"pkg", "pkg.sub", "pkg.base", "pkg.sub.impl", "pkg.sub.other", "pkg.tool"}
    graph = import_graph(modules)
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.base"}, "pkg.base": {"pkg.sub.impl"},
                     "pkg.sub.impl": {"pkg.base", "pkg.sub.other"}, "pkg.sub.other": {"pkg.base"},
                     "pkg.tool": {"pkg.sub", "pkg", "pkg.base"}}
    assert cycles(graph) == [(["pkg.base", "pkg.sub.impl", "pkg.sub.other"], ["pkg.base", "pkg.sub.impl", "pkg.base"])]
    graph["pkg.base"] = set()  # without the lazy import: no cycle
    assert not cycles(graph)
    assert file_imports(modules["pkg.sub.other"], modules, "pkg.sub.other")[1] == {"pyyaml", "tf_models_official"}
    assert file_imports(modules["pkg.base"], modules, "pkg.base")[1] == set()  # os: standard library
    assert file_imports(modules["pkg.tool"], modules, "pkg.tool")[1] == {"tqdm"}  # from the script it runs


def test_dep_problems_names_the_target_and_the_missing_and_extra_deps(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\nimport numpy\n",
                      "pkg/b.py": "", "pkg/c.py": "", "tests/test_a.py": "import pytest\nfrom pkg import a\n"})
    _write(tmp_path, {"BUILD": "\n".join([
        'py_library(name = "pkg", srcs = ["pkg/__init__.py"])',
        'py_library(name = "a", srcs = ["pkg/a.py"], deps = [":c", "@pypi//tensorflow"])',
        'py_library(name = "b", srcs = ["pkg/b.py"])',
        'py_library(name = "c", srcs = ["pkg/c.py"])',
        'py_test(name = "test_a", srcs = ["tests/test_a.py"], deps = [":a", "@pypi//pytest"])'])})
    rules = build_rules(tmp_path / "BUILD")
    modules = find_modules(tmp_path, ["pkg"])
    libraries = libraries_by_module(rules, tmp_path, ["pkg"])
    assert libraries == {"pkg": "pkg", "pkg.a": "a", "pkg.b": "b", "pkg.c": "c"}
    (problem,) = [p for kind, kw in rules for p in dep_problems(kind, kw, modules, libraries, tmp_path)]
    assert problem.startswith('py_library(name = "a"')
    assert 'missing deps [":b", "@pypi//numpy"]' in problem
    assert 'extra deps (not imported) [":c", "@pypi//tensorflow"]' in problem
