"""The import graph (``tests/import_graph.py``): no cycles, imports that run down the parts of the package, and a
``BUILD`` file that is the one generated from the imports."""
from __future__ import annotations

import os
import pathlib
import re
import sys
from collections.abc import Mapping, Sequence

sys.path.insert(0, os.path.dirname(__file__))
import import_graph  # noqa: E402  (next to this file; tests are not a package)

# ---- the tree -------------------------------------------------------------------------------------------------

def test_no_import_cycles():
    found = import_graph.cycles(import_graph.import_graph(import_graph.find_modules()))
    assert not found, "import cycles (a lazy import inside a function is still an arrow):\n" + "\n".join(
        f"{' -> '.join(path)}   (modules in the cycle: {', '.join(component)})" for component, path in found)


# The parts of the code, lowest first: a module may import only from its own part or from parts below it
# (docs/architecture.md). The Beam jobs (``beam_jobs/``, one part) sit beside the package and use it; the package
# reaches them only from above: its entry points hand the index builder (``embed_blocks``) to what runs it.
PARTS = ("errors", "command_line", "resources", "library_logs", "process_settings", "host_machine", "stages", "config",
         "artifacts", "layers", "data", "networks", "models", "index", "export", "core", "release", "tasks", "retro",
         "serving", "beam_jobs", "demo", "commands", "cli")


def part(module: str) -> str | None:
    """The part of ``module``: ``realm_tf.<part>...``, ``beam_jobs`` for a Beam job, None for the package roots."""
    if module.startswith("beam_jobs.") or module == "beam_jobs":
        return "beam_jobs"
    return module.split(".")[1] if module.startswith("realm_tf.") else None


def layer_violations(modules: Mapping[str, pathlib.Path], parts: Sequence[str] = PARTS) -> list[str]:
    """``a -> b`` for every import from a part to a part above it."""
    rank = {name: i for i, name in enumerate(parts)}
    found = []
    for module, path in modules.items():
        here = part(module)
        if here is None:
            continue
        assert here in rank, f"{module}: {here} is not one of the parts {parts}"
        internal, _ = import_graph.file_imports(path, modules, module)
        for target in sorted(internal):
            there = part(target)
            if there is not None and rank[there] > rank[here]:
                found.append(f"{module} -> {target}")
    return found


def test_imports_run_down_the_parts_of_the_package():
    found = layer_violations(import_graph.find_modules())
    assert not found, f"imports that run up the parts {' < '.join(PARTS)}:\n" + "\n".join(found)


def test_layer_violations_finds_an_arrow_up(tmp_path):
    _write(tmp_path, {"realm_tf/__init__.py": "", "realm_tf/data/__init__.py": "", "realm_tf/tasks/__init__.py": "",
                      "realm_tf/data/a.py": "from realm_tf.tasks import b\n",
                      "realm_tf/tasks/b.py": "from realm_tf.data import a\n"})
    found = layer_violations(import_graph.find_modules(tmp_path, ("realm_tf",)))
    assert found == ["realm_tf.data.a -> realm_tf.tasks.b"]


def test_layer_violations_finds_the_package_importing_a_beam_job(tmp_path):
    _write(tmp_path, {"realm_tf/__init__.py": "", "realm_tf/index/__init__.py": "", "beam_jobs/__init__.py": "",
                      "realm_tf/commands/__init__.py": "", "beam_jobs/job.py": "from realm_tf.index import a\n",
                      "realm_tf/index/a.py": "def f():\n    from beam_jobs import job\n",
                      "realm_tf/commands/c.py": "from beam_jobs import job\n"})
    found = layer_violations(import_graph.find_modules(tmp_path, ("realm_tf", "beam_jobs")))
    assert found == ["realm_tf.index.a -> beam_jobs.job"]


def test_library_deps_are_the_imports():
    problems = import_graph.problems(import_graph.LIBRARY_KINDS,
                                     lambda kw: any(s.split("/")[0] in import_graph.PACKAGES for s in kw["srcs"]))
    assert not problems, "BUILD deps differ from the imports:\n" + "\n".join(problems)


def test_test_deps_are_the_imports():
    problems = import_graph.problems(("py_test",), lambda kw: True)
    assert not problems, "BUILD deps differ from the imports:\n" + "\n".join(problems)


# ---- the checks themselves, on synthetic graphs and trees ------------------------------------------------------

def test_cycles_finds_every_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "s": {"s"}, "x": {"y"}, "y": {"x"}}
    assert import_graph.cycles(graph) == [(["a", "b", "c"], ["a", "b", "c", "a"]), (["s"], ["s", "s"]),
                             (["x", "y"], ["x", "y", "x"])]
    assert import_graph.cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [(["a", "b", "c"], ["a", "b", "a"])]
    assert not import_graph.cycles({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}})
    long_chain = {str(i): {str(i + 1)} for i in range(5000)}  # deep graphs do not hit the recursion limit
    assert not import_graph.cycles(long_chain)
    ((component, path),) = import_graph.cycles({**long_chain, "5000": {"0"}})
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
    modules = import_graph.find_modules(tmp_path, ["pkg"])
    assert set(modules) == {"pkg", "pkg.sub", "pkg.base", "pkg.sub.impl", "pkg.sub.other", "pkg.tool"}
    graph = import_graph.import_graph(modules)
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.base"}, "pkg.base": {"pkg.sub.impl"},
                     "pkg.sub.impl": {"pkg.base", "pkg.sub.other"}, "pkg.sub.other": {"pkg.base"},
                     "pkg.tool": {"pkg.sub", "pkg", "pkg.base"}}
    assert import_graph.cycles(graph) == [(["pkg.base", "pkg.sub.impl", "pkg.sub.other"],
                                           ["pkg.base", "pkg.sub.impl", "pkg.base"])]
    graph["pkg.base"] = set()  # without the lazy import: no cycle
    assert not import_graph.cycles(graph)
    assert (import_graph.file_imports(modules["pkg.sub.other"], modules, "pkg.sub.other")[1]
            == {"pyyaml", "tf_models_official"})
    assert import_graph.file_imports(modules["pkg.base"], modules, "pkg.base")[1] == set()  # os: standard library
    assert import_graph.file_imports(modules["pkg.tool"], modules, "pkg.tool")[1] == {"tqdm"}  # from the script it runs


def test_dep_problems_names_the_target_and_the_missing_and_extra_deps(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\nimport numpy\n",
                      "pkg/b.py": "", "pkg/c.py": "", "tests/test_a.py": "import pytest\nfrom pkg import a\n"})
    _write(tmp_path, {"BUILD": "\n".join([
        'py_library(name = "pkg", srcs = ["pkg/__init__.py"])',
        'py_library(name = "a", srcs = ["pkg/a.py"], deps = [":c", "@pypi//tensorflow"])',
        'py_library(name = "b", srcs = ["pkg/b.py"])',
        'py_library(name = "c", srcs = ["pkg/c.py"])',
        'py_test(name = "test_a", srcs = ["tests/test_a.py"], deps = [":a", "@pypi//pytest"])'])})
    rules = import_graph.build_rules(tmp_path / "BUILD")
    modules = import_graph.find_modules(tmp_path, ["pkg"])
    libraries = import_graph.libraries_by_module(rules, tmp_path, ["pkg"])
    assert libraries == {"pkg": "pkg", "pkg.a": "a", "pkg.b": "b", "pkg.c": "c"}
    (problem,) = [p for kind, kw in rules for p in import_graph.dep_problems(kind, kw, modules, libraries, tmp_path)]
    assert problem.startswith('py_library(name = "a"')
    assert 'missing deps [":b", "@pypi//numpy"]' in problem
    assert 'extra deps (not imported) [":c", "@pypi//tensorflow"]' in problem


# ---- the generated BUILD ----------------------------------------------------------------------------------------

def test_build_is_the_generated_one():
    generated = import_graph.generate_build()
    head = "".join(generated.splitlines(keepends=True)[:6])
    assert "Generated from the imports" in head and "NOT BUILT BY CI" in head  # it says what it is
    assert (import_graph.REPO / "BUILD").read_text(encoding="utf-8") == generated, (
        "BUILD differs from the one generated from the imports: run `make build-file`")


def test_generate_build_derives_srcs_and_deps_and_keeps_other_attributes(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "", "pkg/a.py": "from pkg import b\nimport numpy\n", "pkg/b.py": "import yaml\n",
        "tests/conftest.py": "import pytest\n", "tests/sub/helper.py": "from pkg import b\n",
        "tests/sub/test_a.py": "import helper\nfrom pkg import a\nimport os\n",
        "BUILD": ('py_test(name = "test_a", srcs = ["stale.py"], deps = [":gone"], size = "small",'
                  ' data = ["x.json"])\npy_library(name = "a", srcs = ["pkg/a.py"], deps = [":b"])\n')})
    text = import_graph.generate_build(tmp_path, ("pkg",))
    (tmp_path / "BUILD").write_text(text, encoding="utf-8")
    rules = {kw["name"]: (kind, kw) for kind, kw in import_graph.build_rules(tmp_path / "BUILD")}
    assert rules["a"] == ("py_library", {"name": "a", "srcs": ["pkg/a.py"], "deps": [":b", "@pypi//numpy"]})
    assert rules["b"] == ("py_library", {"name": "b", "srcs": ["pkg/b.py"], "deps": ["@pypi//pyyaml"]})
    assert rules["pkg"] == ("py_library", {"name": "pkg", "srcs": ["pkg/__init__.py"]})
    assert rules["test_a"] == ("py_test", {
        "name": "test_a", "srcs": ["tests/sub/test_a.py", "tests/conftest.py", "tests/sub/helper.py"],
        "deps": [":a", ":b", "@pypi//pytest"], "size": "small", "data": ["x.json"]})
    assert import_graph.generate_build(tmp_path, ("pkg",)) == text  # a fixed point
    libraries = import_graph.libraries_by_module(import_graph.build_rules(tmp_path / "BUILD"), tmp_path, ["pkg"])
    assert not [p for kind, kw in import_graph.build_rules(tmp_path / "BUILD")
                for p in import_graph.dep_problems(kind, kw, import_graph.find_modules(tmp_path, ["pkg"]), libraries,
                                                   tmp_path)]


def test_generate_build_refuses_two_modules_with_one_target_name(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/x/__init__.py": "", "pkg/x/util.py": "", "pkg/y/__init__.py": "",
                      "pkg/y/util.py": ""})
    try:
        import_graph.generate_build(tmp_path, ("pkg",), kept=[])
    except ValueError as e:
        assert "pkg.x.util and pkg.y.util" in str(e)
    else:
        raise AssertionError("two modules named util were given one target")


def test_the_layout_table_names_every_package_and_the_import_order():
    architecture = (import_graph.REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in (import_graph.REPO / "realm_tf").iterdir()
                      if (p / "__init__.py").exists())
    missing = [name for name in packages if f"| `realm_tf/{name}/` |" not in architecture]
    assert not missing, f"docs/architecture.md's layout table has no row for realm_tf/{missing}"
    stated = architecture.split("**Imports run one way**", 1)[1].split("with no exception", 1)[0]
    order = re.findall(r"`([a-z_]+)`", stated)
    assert order == list(PARTS), stated
