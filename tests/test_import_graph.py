"""The package's import graph has no cycle.

Edges are every ``import`` / ``from ... import`` anywhere in a module: at module level, inside
functions, under ``TYPE_CHECKING`` alike (moving an import into a function hides a cycle from Python,
not from the design). ``from .x import name`` counts as an edge to ``x.name`` when that is a module,
else to ``x``. A module importing its own enclosing package's ``__init__`` is not counted (that is how
a package re-exports). Cycles are the strongly connected components of more than one module.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "reward_lens_spec"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for f in root.rglob("*.py"):
        rel = f.relative_to(root.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = f
    return out


def _targets(mods: dict[str, Path], cur: str, node) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = cur.split(".")
        is_pkg = mods[cur].name == "__init__.py"
        parts = parts[: len(parts) - node.level + (1 if is_pkg else 0)]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module doc)."""
    mods = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for tgt in _targets(mods, m, node):
                while tgt and tgt not in mods:
                    tgt = tgt.rpartition(".")[0]
                if tgt and tgt != m and not (mods[tgt].name == "__init__.py" and m.startswith(tgt + ".")):
                    edges[m].add(tgt)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_function_level_imports_are_edges():
    edges = import_graph()
    # models.head imports models.armorm inside read_head; models.loading at module level
    assert "reward_lens_spec.models.armorm" in edges["reward_lens_spec.models.head"]
    assert "reward_lens_spec.models.hub" in edges["reward_lens_spec.models.loading"]


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(
        ", ".join(m.removeprefix("reward_lens_spec.") for m in c) for c in found)
