"""No import circle in the package, counting local and TYPE_CHECKING imports.

A circle means two modules cannot be understood (or loaded, or tested) one without the
other. ``KNOWN`` lists the circles that still exist, each with its owner's reason to keep
it for now; the test fails on a new circle and on a known one that is gone (remove it).
"""

from __future__ import annotations

from test_layout import imports, modules

#: circles not broken yet (each is a set of modules)
KNOWN: set[frozenset[str]] = set()


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        module: {t for t, _ in imports(module, path, is_package, set(known)) if t in known}
        - {module}
        for module, (path, is_package) in known.items()
    }


def circles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_the_circle_finder_finds_circles() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == {frozenset({"a", "b", "c"})}
    assert circles({"a": {"b"}, "b": set()}) == set()


def test_no_import_circle_in_the_package() -> None:
    assert circles(graph()) == KNOWN


def test_the_run_layer_has_no_circle() -> None:
    """The run's parts import neither Run nor Guard: run/ is free of circles."""
    assert [c for c in circles(graph()) if any(m.startswith("tether.run.") for m in c)] == []
