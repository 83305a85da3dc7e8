"""BUILD covers the tree: a py_library for every module, a py_test for every test file, deps resolve."""
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _targets():
    rules = []

    def rule(kind):
        return lambda **kw: rules.append((kind, kw))

    namespace = {"load": lambda *a, **k: None, "package": lambda **k: None,
                 "py_library": rule("py_library"), "py_test": rule("py_test"), "py_binary": rule("py_binary")}
    exec(compile((REPO / "BUILD").read_text(), str(REPO / "BUILD"), "exec"), namespace)
    return rules


def test_every_module_is_in_a_py_library():
    libs = {src for kind, kw in _targets() if kind in ("py_library", "py_binary") for src in kw["srcs"]}
    modules = {str(p.relative_to(REPO)) for d in ("realm_tf", "beam_jobs") for p in (REPO / d).rglob("*.py")}
    assert not modules - libs, f"modules without a py_library in BUILD: {sorted(modules - libs)}"


def test_every_test_file_is_in_a_py_test():
    tests = {src for kind, kw in _targets() if kind == "py_test" for src in kw["srcs"]}
    files = {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")}
    assert not files - tests, f"test files without a py_test in BUILD: {sorted(files - tests)}"


def test_srcs_exist_names_unique_and_deps_resolve():
    rules = _targets()
    names = [kw["name"] for _, kw in rules]
    assert len(names) == len(set(names)), "duplicate target names"
    for kind, kw in rules:
        for src in kw["srcs"] + kw.get("data", []):
            assert (REPO / src).exists(), f"{kw['name']}: {src} does not exist"
        for dep in kw.get("deps", []):
            assert dep.startswith("@pypi//") or dep.lstrip(":") in names, f"{kw['name']}: unknown dep {dep}"
