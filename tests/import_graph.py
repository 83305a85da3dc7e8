"""The import graph, read statically (``ast``; nothing is imported), and the Bazel ``BUILD`` file generated from it.

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
import re
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
        elif isinstance(node, ast.Call) and _called_name(node.func) == "Call":
            names.extend((target.split(":")[0], True) for target in _call_targets(node))
        elif (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)):
            try:
                script = ast.parse(node.value.value)
            except SyntaxError:
                continue
            names.extend(_tree_imports(script, None, False, f"{where}: script at line {node.lineno}"))
    return names


def _called_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _call_targets(node: ast.Call) -> list[str]:
    """The ``"package.module:function"`` names of a ``stages.Call(target, ..., report=...)``: the modules a stage
    imports when it runs."""
    given = [*node.args[:1], *(k.value for k in node.keywords if k.arg in ("target", "report"))]
    return [v.value for v in given if isinstance(v, ast.Constant) and isinstance(v.value, str)
            and re.fullmatch(r"[A-Za-z_][\w.]*:[\w.]+", v.value)]


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
            if target != module:  # a stage naming a function of its own module
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


def problems(kinds: Sequence[str], select: Callable[[Mapping[str, Any]], bool]) -> list[str]:
    """``dep_problems`` of the BUILD rules of ``kinds`` that ``select`` picks."""
    rules = build_rules()
    modules = find_modules()
    libraries = libraries_by_module(rules)
    return [problem for kind, kw in rules if kind in kinds and select(kw)
            for problem in dep_problems(kind, kw, modules, libraries)]


# ---- generating BUILD ------------------------------------------------------------------------------------------

#: Where a test's bare ``import name`` finds a helper module (the test's own directory first, then anywhere under
#: these): the helpers among the tests, and benchmarks/ for the results checks.
HELPER_DIRS = ("tests", "benchmarks")
#: The attributes the generator writes; any other attribute of a rule (``data``, ``size``, ...) is kept as written.
MANAGED = ("name", "srcs", "deps")
HEADER = """\
# Bazel targets for realm_tf (rules_python): one py_library per module of realm_tf/ and beam_jobs/, one py_test per
# test file. Generated from the imports by `make build-file` (tests/import_graph.py; tests/test_imports.py fails
# when this file is stale): `name`, `srcs` and `deps` are rewritten, every other attribute (`data`, `size`) is kept.
# NOT BUILT BY CI: no Bazel runs here or in CI (`make test` is the build). The targets state the import graph for
# a Bazel workspace that vendors this tree; they have not been built.
load("@rules_python//python:defs.bzl", "py_library", "py_test")

package(default_visibility = ["//visibility:public"])
"""


def library_name(module: str) -> str:
    """The target name of a module: its last dotted part (a package's is the package's own name)."""
    return module.split(".")[-1]


def test_sources(test: pathlib.Path, modules: Iterable[str], root: pathlib.Path = REPO) -> list[pathlib.Path]:
    """``test`` and what pytest runs with it: every ``conftest.py`` from tests/ down to its directory, and the helper
    modules they import by bare name (next to the test, in tests/ or in benchmarks/), transitively."""
    modules = set(modules)
    chain = [test.parent, *test.parent.parents]
    sources = [test] + [d / "conftest.py" for d in reversed(chain)
                        if (root / "tests") in (d, *d.parents) and (d / "conftest.py").exists()]
    queue = list(sources)
    while queue:
        path = queue.pop(0)
        for name, absolute in imported_names(path):
            if not absolute or "." in name or resolve(name, modules) or name in sys.stdlib_module_names:
                continue
            found = [path.parent / f"{name}.py"] + [p for d in HELPER_DIRS
                                                    for p in sorted((root / d).rglob(f"{name}.py"))]
            helper = next((p for p in found if p.exists()), None)
            if helper is not None and helper not in sources:
                sources.append(helper)
                queue.append(helper)
    return sources


def rule_deps(sources: Sequence[pathlib.Path], modules: Iterable[str], own: Iterable[str] = (),
              module_of: Callable[[pathlib.Path], str | None] = lambda path: None) -> list[str]:
    """The deps of a rule whose srcs are ``sources``: the library of every package module they import (other than
    ``own``), and ``@pypi//`` for every third-party package (a helper among ``sources`` is not one)."""
    modules = set(modules)
    internal, external = set(), set()
    for path in sources:
        mod_int, mod_ext = file_imports(path, modules, module_of(path))
        internal |= mod_int
        external |= mod_ext
    internal -= set(own)
    external -= {path.stem for path in sources}
    return sorted(f":{library_name(m)}" for m in internal) + sorted(f"@pypi//{name}" for name in external)


def _format_rule(kind: str, attributes: Mapping[str, Any]) -> str:
    """One rule in buildifier's layout: an attribute per line, a list of more than one item one per line."""
    lines = [f"{kind}("]
    for key, value in attributes.items():
        if isinstance(value, (list, tuple)) and len(value) > 1:
            lines.append(f"    {key} = [")
            lines.extend(f'        "{item}",' for item in value)
            lines.append("    ],")
        elif isinstance(value, (list, tuple)):
            lines.append(f"    {key} = [{', '.join(chr(34) + item + chr(34) for item in value)}],")
        else:
            lines.append(f'    {key} = "{value}",')
    lines.append(")")
    return "\n".join(lines)


def generate_build(root: pathlib.Path = REPO, packages: Sequence[str] = PACKAGES,
                   kept: Sequence[tuple[str, Mapping[str, Any]]] | None = None) -> str:
    """The text of ``BUILD`` for the tree under ``root``: a ``py_library`` per module of ``packages``, a ``py_test``
    per ``tests/**/test_*.py``, deps from the imports; ``kept`` (the current rules; read from ``root/BUILD`` when
    None) gives each target's attributes other than :data:`MANAGED`.

    Raises:
      ValueError: when two modules or two test files would get the same target name.
    """
    if kept is None:
        kept = build_rules(root / "BUILD") if (root / "BUILD").exists() else []
    extra = {kw["name"]: {k: v for k, v in kw.items() if k not in MANAGED} for _, kw in kept}
    modules = find_modules(root, packages)
    names: dict[str, str] = {}
    for module in modules:
        clash = names.setdefault(library_name(module), module)
        if clash != module:
            raise ValueError(f"modules {clash} and {module} would both be the target :{library_name(module)}")
    sections: dict[str, list[str]] = collections.defaultdict(list)
    for module, path in sorted(modules.items()):
        deps = rule_deps([path], modules, {module}, lambda p, module=module: module)
        attributes = {"name": library_name(module), "srcs": [path.relative_to(root).as_posix()],
                      **({"deps": deps} if deps else {}), **extra.get(library_name(module), {})}
        section = path.parent.relative_to(root).as_posix()
        sections[section].append(_format_rule("py_library", attributes))
    tests: dict[str, pathlib.Path] = {}
    for test in sorted((root / "tests").rglob("test_*.py")):
        clash = tests.setdefault(test.stem, test)
        if clash != test or test.stem in names:
            raise ValueError(f"{test.relative_to(root)}: the target :{test.stem} is taken")
        sources = test_sources(test, modules, root)
        deps = rule_deps(sources, modules)
        attributes = {"name": test.stem, "srcs": [s.relative_to(root).as_posix() for s in sources],
                      **({"deps": deps} if deps else {}), **extra.get(test.stem, {})}
        sections[test.parent.relative_to(root).as_posix()].append(_format_rule("py_test", attributes))
    parts = [HEADER]
    for section in sorted(sections, key=lambda s: (s.startswith("tests"), s)):
        parts.append(f"# ---- {section} " + "-" * max(3, 110 - len(section)) + "\n")
        parts.append("\n\n".join(sections[section]) + "\n")
    return "\n".join(parts)


def main(argv: Sequence[str]) -> int:
    """``python tests/import_graph.py --write`` rewrites BUILD; without ``--write``, exits 1 when it is stale."""
    text = generate_build()
    if "--write" in argv:
        (REPO / "BUILD").write_text(text, encoding="utf-8")
        return 0
    stale = (REPO / "BUILD").read_text(encoding="utf-8") != text
    if stale:
        print("BUILD is stale: run `make build-file`", file=sys.stderr)
    return int(stale)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
