"""No model-kind branch outside the model classes (issue 40).

What differs between the MLP and the transformer lives in the model objects
(``src/diloco/models/``) and in ``diloco.core.model_seam``'s tables (``MODEL_KINDS``,
``_FROM_DATA``, ...). Everywhere else the code asks the model or its ``ModelKind``, never
its name: this test reads every other module of ``src/diloco`` with ``ast`` and fails on a
comparison with ``"mlp"`` or ``"transformer"``, on the model's name (``config.model``,
``model``, ``config.get("model")``, ``config["model"]``, ``getattr(args, "model")``) compared
with ``==``, ``!=``, ``in`` or ``is``, and on a ``match`` over those names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import diloco

SRC = Path(diloco.__file__).resolve().parent
EXEMPT = ("models/", "core/model_seam.py", "workspace_template/")
NAMES = {"mlp", "transformer"}
ALL_MODELS = {"MODELS", "MODEL_KINDS"}  # the set of every model: checking a name against it is validation


def _names_the_model(node: ast.AST) -> bool:
    """``model``, ``x.model``, ``x.get("model")``, ``x["model"]`` or ``getattr(x, "model", ...)``."""
    if isinstance(node, ast.Name):
        return node.id == "model"
    if isinstance(node, ast.Attribute):
        return node.attr == "model"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "model"
    if isinstance(node, ast.Call) and len(node.args) >= 1:
        func, args = node.func, node.args
        if isinstance(func, ast.Attribute) and func.attr == "get":
            return isinstance(args[0], ast.Constant) and args[0].value == "model"
        if isinstance(func, ast.Name) and func.id == "getattr" and len(args) >= 2:
            return isinstance(args[1], ast.Constant) and args[1].value == "model"
    return False


def _is_name(node: ast.AST) -> bool:
    """A literal model name, or a literal collection of model names only (``("muon", "transformer")``
    holds config sections' names)."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_name(item) for item in node.elts)
    return False


def _branch(left: ast.AST, op: ast.cmpop, right: ast.AST) -> bool:
    if not isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn)):
        return False  # an ordering: not a name (engine/layout's ``model <= MODEL_MAX_BYTES`` counts bytes)
    if isinstance(op, (ast.In, ast.NotIn)):
        if isinstance(right, ast.Name) and right.id in ALL_MODELS:
            return False
        return _is_name(right) or _names_the_model(left) or _names_the_model(right)
    return _is_name(left) or _is_name(right) or _names_the_model(left) or _names_the_model(right)


def model_branches(source: str, filename: str = "<source>") -> list[str]:
    """Each model-kind branch of ``source``, as ``filename:line: code``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_branch(a, op, b) for a, op, b in zip(operands[:-1], node.ops, node.comparators, strict=True)):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Match):
            cases = [case.pattern for case in node.cases if isinstance(case.pattern, ast.MatchValue)]
            if _names_the_model(node.subject) or any(_is_name(pattern.value) for pattern in cases):
                found.append(f"{filename}:{node.lineno}: match {ast.unparse(node.subject)}")
    return found


@pytest.mark.parametrize("branch", [
    'if config.model == "transformer": pass',
    'if "mlp" != kind: pass',
    "if model is None: pass",
    "if model is not None: pass",
    'x = 1 if config.get("model") == "transformer" else 6',
    'x = 1 if getattr(args, "model", None) == "transformer" else 6',
    'if summary["config"]["model"] in ("mlp",): pass',
    'if name in {"transformer"}: pass',
    "if base.model != other.model: pass",
    "match config.model:\n    case _: pass",
    'match name:\n    case "mlp": pass',
])
def test_the_walker_finds_a_planted_branch(branch):
    assert model_branches(branch)


@pytest.mark.parametrize("fine", [
    'if "transformer" in data: pass',  # a config section's key
    'if key in ("muon", "transformer"): pass',  # config sections' keys
    "if model <= MODEL_MAX_BYTES: pass",  # a size
    "if self.model not in MODELS: pass",  # validation against every model
    "if model_kind(config).sequence_model: pass",
    "if kind is not owner: pass",
    'if config.engine == "fast": pass',
])
def test_the_walker_lets_what_asks_the_model_pass(fine):
    assert model_branches(fine) == []


def test_no_model_kind_branch_outside_the_model_classes():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if not any(relative.startswith(prefix) or f"/{prefix}" in f"/{relative}" for prefix in EXEMPT):
            found += model_branches(path.read_text(encoding="utf-8"), relative)
    assert not found, ("model-kind branches outside src/diloco/models/ and core/model_seam.py (ask the model "
                       "or its ModelKind instead):\n" + "\n".join(found))
