"""Each piece of a run's state has one owner (#38): no module writes the private fields of a
run's state (``RunState``'s ``_``-named attributes) but the state's own module and the parts
of the run listed in ``KNOWN``, each with the number of writes it still makes.

A write is an assignment (``=``, ``+=``, an annotated one, ``del``) to such a field, or to an
item of it, or a call of a mutating method on it (``append``, ``update``, ``pop``, ...), on
anything but ``self`` (a class's own fields of the same name are its own). The test fails on
a write from a module not listed (an adapter, a store, a new part), on a listed module
writing more than its count, and on one writing fewer (lower its count: the table only
shrinks).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
OWNER = "tether/run/_runstate.py"

#: the parts of a run that still write its state's private fields themselves, and how often
#: (they are to receive what they read and return what Run applies; a count only falls)
KNOWN: dict[str, int] = {}

_MUTATORS = frozenset(
    {"append", "appendleft", "extend", "update", "clear", "pop", "popitem", "add", "discard"}
    | {"remove", "insert", "setdefault", "move_to_end", "__setitem__", "__delitem__"}
)


def private_fields() -> set[str]:
    """The ``_``-named attributes ``RunState`` sets on itself."""
    tree = ast.parse((SRC / OWNER).read_text())
    state = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunState")
    return {
        n.attr
        for n in ast.walk(state)
        if isinstance(n, ast.Attribute)
        and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and n.attr.startswith("_")
    }


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign | ast.Delete):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found = [node.target]
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MUTATORS
    ):
        found = [node.func.value]
    else:
        return []
    out: list[ast.expr] = []
    for target in found:
        out.extend(target.elts if isinstance(target, ast.Tuple | ast.List) else [target])
    return out


def writes(source: str, fields: set[str]) -> list[str]:
    """The writes to ``fields`` in ``source`` on anything but ``self``, as source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            base = target
            while isinstance(base, ast.Subscript):
                base = base.value
            if (
                isinstance(base, ast.Attribute)
                and base.attr in fields
                and not (isinstance(base.value, ast.Name) and base.value.id == "self")
            ):
                found.append(f"{getattr(node, 'lineno', '?')}: {ast.unparse(target)}")
    return found


def count() -> tuple[Counter[str], dict[str, list[str]]]:
    fields = private_fields()
    counts: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for path in sorted((SRC / "tether").rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        if name == OWNER:
            continue
        found = writes(path.read_text(), fields)
        if found:
            counts[name] = len(found)
            where[name] = found
    return counts, where


def test_the_counter_sees_a_write() -> None:
    """The counter itself: a write through another object counts, one through self not."""
    source = "s._stop = 1\nrun._state._effects.append(x)\nself._stop = 2\nx.s._issues[0] = 1\n"
    assert len(writes(source, {"_stop", "_effects", "_issues"})) == 3


def test_no_module_writes_a_runs_private_state_but_its_parts_known() -> None:
    """0 writes outside the run's own parts (adapters, stores, the run document's reader and
    writer); the known parts no more than their count, and the table kept exact."""
    counts, where = count()
    unknown = {name: where[name] for name in counts if name not in KNOWN}
    assert unknown == {}, f"modules that write a run's private state: {unknown}"
    grown = {n: (counts[n], KNOWN[n]) for n in counts if counts[n] > KNOWN[n]}
    assert grown == {}, f"more writes than known (now, known): {grown} {where}"
    assert dict(counts) == KNOWN, "fewer writes than known: lower KNOWN to what the test finds"
