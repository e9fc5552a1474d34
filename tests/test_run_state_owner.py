"""Each piece of a run's state has one owner (#38): no module writes the private fields of a
run's state (``RunState``'s ``_``-named attributes) but the state's own module (the parts read
the state and call its functions, each named for the change it makes) and the modules listed
in ``KNOWN`` (none now), each with the number of writes it still makes.

A write is an assignment (``=``, ``+=``, an annotated one, ``:=``, ``del``) to such a field, or
to an item of it, or a call of a mutating method on it (``append``, ``update``, ``pop``, ...),
reached through an attribute, a name bound to the field, ``getattr``, ``vars`` / ``__dict__``,
or made by ``setattr`` / ``delattr`` with the field's name, on anything but a method's ``self``
(a class's own fields of the same name are its own). The test fails on a write from a module
not listed (an adapter, a store, a new part), on a listed module writing more than its count,
and on one writing fewer (lower its count: the table only shrinks). A ``setattr`` by a name
known only at run time is listed in ``DYNAMIC``, each checked by hand.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from tether.run._run import _FromState

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


#: the calls that set or delete an attribute by name: (object, name) are their first two arguments
_SETTERS = frozenset({"setattr", "delattr", "object.__setattr__", "object.__delattr__"})

#: modules that set attributes by a name known only when they run, on something not ``self``,
#: and how often; each is checked by hand: the CrewAI adapter's ``_set`` (its tools' and
#: models' methods, past pydantic), the run's ``_FromState`` setter (``run.<name> = ...``),
#: whose private names refuse a write (test_the_run_sets_no_private_field_of_its_state)
#: (tether/_frozen.py: ``set_fields`` sets a frozen value's own fields, in its ``__init__``)
DYNAMIC: dict[str, int] = {
    "tether/_frozen.py": 1,
    "tether/integrations/crewai.py": 1,
    "tether/run/_run.py": 1,
}


def _name(node: ast.expr, constants: dict[str, str]) -> str | None:
    """The text of a string constant, or of a module-level name bound to one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign | ast.Delete):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.NamedExpr):
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


class _Writes(ast.NodeVisitor):
    """The writes of one module to ``fields`` on anything but the ``self`` of a method.

    A write reaches a field through its attribute (``s._stop = ...``), ``getattr(s, "_stop")``,
    ``vars(s)`` / ``s.__dict__`` with the field's name, a name bound to the field in the same
    function (``issues = s._issues; issues.append(...)``), or ``setattr`` / ``delattr`` with the
    field's name (a constant, or a module-level name bound to one). A ``setattr`` whose name is
    known only at run time is listed apart (``dynamic``). ``self`` is exempt only in a function
    defined in a class (a method, and what it defines); a module-level function's ``self`` is a
    name like any other."""

    def __init__(self, fields: set[str], constants: dict[str, str]) -> None:
        self.fields, self.constants = fields, constants
        self.found: list[str] = []
        self.dynamic: list[str] = []
        self.in_method = False
        self.aliases: set[str] = set()

    def _is_self(self, node: ast.expr) -> bool:
        return self.in_method and isinstance(node, ast.Name) and node.id == "self"

    def _field(self, node: ast.expr) -> bool:
        """``node`` is a field of the run's state (reached through anything but self)."""
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute):
            return node.attr in self.fields and not self._is_self(node.value)
        if isinstance(node, ast.Name):
            return node.id in self.aliases
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
        ):
            name = _name(node.args[1], self.constants)
            return name in self.fields and not self._is_self(node.args[0])
        return False

    def _dict_write(self, node: ast.expr) -> bool:
        """``vars(x)[name]`` / ``x.__dict__[name]`` with a field's name, x not self."""
        if not isinstance(node, ast.Subscript):
            return False
        base, key = node.value, _name(node.slice, self.constants)
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name):
            owner = base.args[0] if base.func.id == "vars" and base.args else None
        elif isinstance(base, ast.Attribute) and base.attr == "__dict__":
            owner = base.value
        else:
            return False
        return owner is not None and key in self.fields and not self._is_self(owner)

    def _scope(self, node: ast.AST, in_method: bool) -> None:
        saved = self.in_method, self.aliases
        self.in_method, self.aliases = in_method, set(self.aliases)
        self.generic_visit(node)
        self.in_method, self.aliases = saved

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for child in node.body:
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                self._scope(child, True)
            else:
                self.visit(child)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._scope(node, self.in_method)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _bind(self, target: ast.expr, value: ast.expr | None) -> None:
        """Names bound to a field (``a = s._x``, ``a, b = s._x, s._y``) become its aliases."""
        if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._bind(t, v)
        elif isinstance(target, ast.Name):
            if value is not None and self._field(value):
                self.aliases.add(target.id)
            else:
                self.aliases.discard(target.id)

    def generic_visit(self, node: ast.AST) -> None:
        rebinds = isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr | ast.Delete)
        for target in _targets(node):
            if rebinds and isinstance(target, ast.Name):
                continue  # a name bound again (an alias no more), not the field written
            if self._field(target) or self._dict_write(target):
                self.found.append(f"{getattr(node, 'lineno', '?')}: {ast.unparse(target)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in _SETTERS and node.args:
            owner, name = node.args[0], node.args[1] if len(node.args) > 1 else None
            text = None if name is None else _name(name, self.constants)
            if not self._is_self(owner):
                if text is None:
                    self.dynamic.append(f"{node.lineno}: {ast.unparse(node)}")
                elif text in self.fields:
                    self.found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind(target, node.value)
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr):
            self._bind(node.target, node.value)
        super().generic_visit(node)


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's names bound to a string once, at its top level (``FIELD = "tether_run"``)."""
    return {
        n.targets[0].id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and len(n.targets) == 1
        and isinstance(n.targets[0], ast.Name)
        and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
    }


def scan(source: str, fields: set[str]) -> _Writes:
    """The writes to ``fields`` in ``source``, and its setattr calls by a run-time name."""
    tree = ast.parse(source)
    found = _Writes(fields, _constants(tree))
    found.visit(tree)
    return found


def writes(source: str, fields: set[str]) -> list[str]:
    """The writes to ``fields`` in ``source`` on anything but a method's ``self``, as text."""
    return scan(source, fields).found


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


def dynamic() -> dict[str, list[str]]:
    """Each module's setattr / delattr calls by a name known at run time, not on self."""
    fields = private_fields()
    found = {}
    for path in sorted((SRC / "tether").rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        calls = scan(path.read_text(), fields).dynamic
        if calls and name != OWNER:
            found[name] = calls
    return found


FIELDS = {"_stop", "_effects", "_issues"}


def test_the_counter_sees_a_write() -> None:
    """The counter itself: a write through another object counts, one through self not."""
    source = (
        "s._stop = 1\nrun._state._effects.append(x)\nx.s._issues[0] = 1\n"
        "class A:\n    def f(self):\n        self._stop = 2\n"
    )
    assert len(writes(source, FIELDS)) == 3


@pytest.mark.parametrize(
    "source",
    [
        "def f(s):\n    issues = s._issues\n    issues.append('x')\n",
        "def f(s):\n    a, issues = 1, s._issues\n    issues[0] = 'x'\n",
        "def f(s):\n    if (issues := s._issues):\n        issues.clear()\n",
        "def f(s):\n    setattr(s, '_stop', None)\n",
        "NAME = '_stop'\ndef f(s):\n    object.__setattr__(s, NAME, None)\n",
        "def f(s):\n    delattr(s, '_stop')\n",
        "def f(s):\n    getattr(s, '_issues').append('x')\n",
        "def f(s):\n    vars(s)['_stop'] = None\n",
        "def f(s):\n    s.__dict__['_stop'] = None\n",
        "def f(self):\n    self._stop = None\n",  # a function of no class: its self is no method's
    ],
)
def test_the_counter_sees_a_write_made_another_way(source: str) -> None:
    """An alias, setattr, getattr, vars / __dict__, a module-level function's self: one write."""
    assert len(writes(source, FIELDS)) == 1


def test_the_counter_leaves_a_methods_self_and_a_rebound_name() -> None:
    """A method's own fields (and what it defines) are its own; a name bound again is not."""
    source = (
        "class A:\n    def f(self):\n        self._stop = 1\n        g = lambda: self._issues.append(1)\n"
        "def h(s):\n    issues = s._issues\n    issues = []\n    issues.append(1)\n"
    )
    assert writes(source, FIELDS) == []


def test_a_setattr_by_a_run_time_name_is_known() -> None:
    """A setattr whose name is known only at run time could write any field: each is listed."""
    assert {name: len(calls) for name, calls in dynamic().items()} == DYNAMIC


def test_the_run_sets_no_private_field_of_its_state() -> None:
    """What the run shows of its state's private fields (``run._loops``...) is read-only: a
    write through the run would be a write from its caller's module."""
    import tether

    run = tether.Guard().start(task="t")
    for field in sorted(private_fields()):
        if isinstance(getattr(type(run), field, None), _FromState):
            before = getattr(run._state, field)
            with pytest.raises(AttributeError):
                setattr(run, field, object())
            assert getattr(run._state, field) is before


def test_no_module_writes_a_runs_private_state_but_its_parts_known() -> None:
    """0 writes outside the run's own parts (adapters, stores, the run document's reader and
    writer); the known parts no more than their count, and the table kept exact."""
    counts, where = count()
    unknown = {name: where[name] for name in counts if name not in KNOWN}
    assert unknown == {}, f"modules that write a run's private state: {unknown}"
    grown = {n: (counts[n], KNOWN[n]) for n in counts if counts[n] > KNOWN[n]}
    assert grown == {}, f"more writes than known (now, known): {grown} {where}"
    assert dict(counts) == KNOWN, "fewer writes than known: lower KNOWN to what the test finds"
