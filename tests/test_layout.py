"""The package's shape is part of its quality bar: small modules, short functions, commands only dispatch."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "oomdoctor"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_module_over_400_lines() -> None:
    long = {str(p.relative_to(PKG)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_80_lines() -> None:
    long = {}
    for p in _modules():
        for f in _functions(ast.parse(p.read_text())):
            n = (f.end_lineno or f.lineno) - f.lineno + 1
            if n > MAX_FUNCTION_LINES:
                long[f"{p.relative_to(PKG)}:{f.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", [p for p in _modules() if "commands" not in p.relative_to(PKG).parts
                                  and p.name not in ("cli.py", "__main__.py")], ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_outside_the_cli_imports_commands(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("oomdoctor.commands"):
            pytest.fail(f"{path.relative_to(PKG)} imports {node.module}: commands/ only dispatch, the core must not need them")


MAX_COMPLEXITY = 30


def _complexity(fn: ast.AST) -> int:
    """McCabe's number as radon counts it: 1 + branches, loops, handlers, boolean operators, comprehension ifs."""
    n = 1
    for node in ast.walk(fn):
        if node is not fn and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.Assert)):
            n += 1
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        elif isinstance(node, ast.match_case):
            n += 1
    return n


def test_no_function_of_complexity_over_30() -> None:
    hot = {}
    for p in _modules():
        for f in _functions(ast.parse(p.read_text())):
            if (c := _complexity(f)) > MAX_COMPLEXITY:
                hot[f"{p.relative_to(PKG)}:{f.name}"] = c
    assert not hot, f"functions of cyclomatic complexity over {MAX_COMPLEXITY}: {hot}"
