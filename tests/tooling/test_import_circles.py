"""No import circles in ``src/diloco``: every import counts, at module level or inside a function
(issue 40). A module that needs another which needs it back shares a part that belongs in a
module below both. Only a script's ``if __name__ == "__main__":`` block is left out: run as a
script the file is ``__main__``, not the module the others import.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_names(root: Path, package: str) -> dict[str, Path]:
    """``diloco.tools.cli.flags`` -> its file, for every module and package under ``root/package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_main_guard(node) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators))


def _import_nodes(tree: ast.AST):
    """Every Import and ImportFrom, however deep, outside ``if __name__ == "__main__":``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not _is_main_guard(child))


def _targets(node, name: str, is_package: bool, known) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1
        package = name.split(".") if is_package else name.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (the nearest known module of each name)."""
    known = module_names(root, package)
    graph = {}
    for name, path in known.items():
        edges = set()
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, name, path.name == "__init__.py", known):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_src_has_no_import_circle():
    graph = import_graph(SRC, "diloco")
    assert len(graph) > 100 and sum(map(len, graph.values())) > 400, "the walk found too little to trust"
    found = circles(graph)
    assert not found, "import circles (each a group of modules that import each other):\n" + "\n".join(
        " <-> ".join(group) for group in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_walk_sees_function_level_and_relative_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def late():\n    from . import c\n",  # a function-level, relative import
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "from pkg.a import something\n",
        "pkg/sub/__init__.py": "from ..d import x\n",
        "pkg/e.py": "import pkg.sub\nif __name__ == '__main__':\n    from pkg import e_user\n",
        "pkg/e_user.py": "from pkg.e import run\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.sub"] == {"pkg.d"} and graph["pkg.e"] == {"pkg.sub"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
