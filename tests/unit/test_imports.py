"""llmbench has no import cycle, counting imports inside functions too (a lazy import hides a
cycle from Python, not from the design: data flows one way, DESIGN.md)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "workflow" / "scripts" / "llmbench"


def import_graph() -> dict[str, set[str]]:
    """Module -> the llmbench modules it imports anywhere in its source."""
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, f in mods.items():
        package = mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[mod].update(n for n in names if n in mods and n != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every cycle found by a depth-first walk from each module (as sorted member tuples)."""
    found = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in path:
                found.add(tuple(sorted(path[path.index(nxt):])))
            elif len(path) < 30:
                walk(nxt, path + [nxt])

    for start in graph:
        walk(start, [start])
    return found


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == {("a", "b", "c")}


def test_llmbench_has_no_import_cycle():
    graph = import_graph()
    assert "llmbench.launch" in graph and "llmbench.aggregate" in graph["llmbench.launch"]
    assert cycles(graph) == set()
