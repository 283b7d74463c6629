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


#: tooling for lent and offline machines (DESIGN.md: it lives apart, and the measuring layers never import it)
LAB = "llmbench.offline"


def lab_importers(graph: dict[str, set[str]], lab: str = LAB) -> set[str]:
    """The modules outside the ``lab`` package that import it or one of its modules."""
    def inside(mod: str) -> bool:
        return mod == lab or mod.startswith(f"{lab}.")

    return {mod for mod, deps in graph.items() if not inside(mod) and any(inside(d) for d in deps)}


def test_the_lab_checker_sees_an_import_of_the_lab_package():
    graph = {"llmbench.launch": {"llmbench.ledger"}, "llmbench.report.tidy": {"llmbench.offline.planner"},
             "llmbench.search": {"llmbench.offline"}, "llmbench.offline.cli": {"llmbench.search.runner"},
             "llmbench.offlinex": {"llmbench.offline.cli"}}
    assert lab_importers(graph) == {"llmbench.report.tidy", "llmbench.search", "llmbench.offlinex"}


def test_nothing_that_measures_imports_the_lent_machine_tooling():
    """Launch, the ledger, train/, serve/, micro/, profile/, search/, report/ and every other
    module of llmbench, and the workflow's adapters and rules, never import llmbench.offline;
    it imports them (to read what they wrote)."""
    import re

    graph = import_graph()
    assert "llmbench.offline.planner" in graph and "llmbench.search.runner" in graph["llmbench.offline.planner"]
    assert lab_importers(graph) == set()
    workflow = PKG.parents[1]
    adapters = {}
    for f in (workflow / "scripts").glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        adapters[f.name] = names
    assert adapters and not {name for name, deps in adapters.items() if any(d.startswith(LAB) for d in deps)}
    rules = [workflow.parent / "Snakefile", *sorted((workflow / "rules").glob("*.smk"))]
    pattern = re.compile(r"^\s*(from|import)\s+llmbench\b.*\boffline\b", re.M)
    assert len(rules) > 1 and not [f.name for f in rules if pattern.search(f.read_text())]
