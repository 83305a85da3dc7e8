"""No library function is over 60 lines (docstring included), unless its docstring says why ("Longer than 60
lines: ..."): a function that long is several steps that want names of their own."""
from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
LIMIT = 60
EXPLAINED = "longer than 60 lines:"


def long_functions(root: pathlib.Path, packages: tuple[str, ...] = ("realm_tf", "beam_jobs")) -> list[str]:
    """``path:line name (n lines)`` for every function over :data:`LIMIT` lines whose docstring does not explain."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                length = node.end_lineno - node.lineno + 1
                if length > LIMIT and EXPLAINED not in (ast.get_docstring(node) or "").lower():
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_library_function_is_over_60_lines():
    found = long_functions(REPO)
    assert not found, "functions over 60 lines (split them, or say why in the docstring):\n" + "\n".join(found)


def test_long_functions_finds_a_long_one_and_accepts_an_explained_one(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    (tmp_path / "realm_tf").mkdir()
    (tmp_path / "realm_tf" / "m.py").write_text(
        f"def short():\n    return 1\n\n\ndef long():\n{body}\n\ndef explained():\n"
        f'    """Longer than 60 lines: one table, read top to bottom."""\n{body}', encoding="utf-8")
    assert long_functions(tmp_path, ("realm_tf",)) == [f"realm_tf/m.py:5 long ({LIMIT + 1} lines)"]
