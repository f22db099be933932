"""Every module of the package small enough to read whole: under 600 lines, and no
function body (its docstring aside) over 120 lines. Oracle: the source files, parsed."""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "volsample"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 600
MAX_BODY_LINES = 120


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return 0 if not body else body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_reads_whole(path):
    source = path.read_text(encoding="utf-8")
    assert source.count("\n") < MAX_MODULE_LINES
    long = {node.name: lines for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (lines := _body_lines(node)) > MAX_BODY_LINES}
    assert not long, f"function bodies over {MAX_BODY_LINES} lines: {long}"


def test_the_rule_sees_the_package():
    assert len(MODULES) > 50 and PACKAGE / "_calls.py" in MODULES
