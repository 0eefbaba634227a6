"""Checks over perfscope's own source that no linter here makes.

An attribute a method assigns on ``self`` under the name of one of its class's methods
hides that method for the instance: every later call fails with "object is not callable".
tune's worker did so on the GPU only (its float64 cache and the method that chose it both
named ``_expected``): every trial of a sweep on the H200 came back an error, and no CPU
test reached that path.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "perfscope"


def shadowed_methods(tree: ast.AST) -> list[str]:
    """'Class.name' for each method of a class that one of its methods assigns on self."""
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        for node in ast.walk(cls):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
            for t in targets:
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id == "self" and t.attr in methods):
                    found.append(f"{cls.name}.{t.attr}")
    return sorted(set(found))


def test_the_check_finds_a_method_hidden_by_an_attribute():
    source = ("class S:\n    def __init__(self):\n        self._expected: dict = {}\n"
              "    def _expected(self, task):\n        return None\n")
    assert shadowed_methods(ast.parse(source)) == ["S._expected"]
    assert shadowed_methods(ast.parse(source.replace("self._expected:", "self._cache:"))) == []


def test_no_method_is_hidden_by_an_instance_attribute():
    found = {str(p.relative_to(PACKAGE)): shadowed_methods(ast.parse(p.read_text()))
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}
