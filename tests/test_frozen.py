"""A public value (``tether._frozen.frozen_dataclass``) is the frozen dataclass it was:
constructed, refused, introspected, compared, pickled and frozen the same, with none of its
methods compiled until a wrong call, ``inspect.signature`` or heavy use asks for them."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pickle
import pkgutil
from collections.abc import Callable
from dataclasses import KW_ONLY, FrozenInstanceError, dataclass, field
from typing import Any

import pytest

import tether
from tether import _frozen
from tether._frozen import Value, frozen_dataclass

made: list[str] = []  # the default factories' calls, in order


def _tags() -> list[str]:
    made.append("tags")
    return ["t"]


def _note() -> str:
    made.append("note")
    return "n"


def _check(self: Any) -> None:
    if self.size < 0:
        raise ValueError(f"size must be >= 0, got {self.size!r}")
    object.__setattr__(self, "label", self.label.strip())


@frozen_dataclass
class Shapes(Value):
    """Every shape a field takes: required, a default, a factory, not in ``__init__``,
    keyword-only; a ``__post_init__`` that checks and normalises."""

    size: int
    label: str = " x "
    tags: list[str] = field(default_factory=_tags)
    note: str = field(default_factory=_note, init=False)
    fixed: int = field(default=7, init=False)
    _: KW_ONLY
    mode: str = "a"
    strict: bool = field(default=False, repr=False, compare=False)

    __post_init__ = _check


@dataclass(frozen=True, slots=True)
class Shapes_:  # the dataclass Shapes stands for, compiled by dataclasses
    """The twin."""

    size: int
    label: str = " x "
    tags: list[str] = field(default_factory=_tags)
    note: str = field(default_factory=_note, init=False)
    fixed: int = field(default=7, init=False)
    _: KW_ONLY
    mode: str = "a"
    strict: bool = field(default=False, repr=False, compare=False)

    __post_init__ = _check


#: calls, right and wrong: each must end as the dataclass's does (its values or its error)
CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1,), {}),
    ((1, "y"), {}),
    ((1, "y", ["a"]), {}),
    ((), {"size": 2, "mode": "b", "strict": True}),
    ((3,), {"tags": [], "label": " z"}),
    ((-1,), {}),  # __post_init__ refuses
    ((), {}),  # missing
    ((1, "y", [], 4), {}),  # too many positional
    ((1,), {"size": 2}),  # twice
    ((1,), {"note": "n"}),  # not an __init__ argument
    ((1,), {"colour": "red"}),  # unknown
    ((1, "y", [], "b"), {"strict": True}),  # a keyword-only one given by position
]


def _ending(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    made.clear()
    try:
        obj = cls(*args, **kwargs)
    except Exception as exc:
        return type(exc), str(exc).replace("Shapes_", "Shapes"), list(made)
    values = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    return "made", values, repr(obj).replace("Shapes_", "Shapes"), list(made)


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
@pytest.mark.parametrize("compiled", [False, True], ids=["shared", "made often"])
def test_a_call_ends_as_the_dataclass_it_stands_for(
    args: tuple[Any, ...], kwargs: dict[str, Any], compiled: bool
) -> None:
    """The shared ``__init__`` binds positions, keywords, defaults and factories (in the
    fields' order) and runs ``__post_init__`` as the compiled one; a wrong call raises the
    dataclass's own error; the same once the class is made often and has its own."""
    if compiled:
        for _ in range(_frozen.HOT + 1):
            Shapes(1)
        assert Shapes.__init__ is _frozen._plan(Shapes).exact
    assert _ending(Shapes, args, kwargs) == _ending(Shapes_, args, kwargs)


def test_a_value_introspects_as_a_dataclass() -> None:
    """Signature, fields, params, ``replace``, ``==``, ``hash``, frozenness, pickling."""
    assert inspect.signature(Shapes) == inspect.signature(Shapes_)
    assert str(inspect.signature(Shapes)) == str(inspect.signature(Shapes_))
    assert [f.name for f in dataclasses.fields(Shapes)] == [
        f.name for f in dataclasses.fields(Shapes_)
    ]
    assert Shapes.__match_args__ == Shapes_.__match_args__
    assert Shapes.__slots__ == Shapes_.__slots__  # type: ignore[attr-defined]
    # as before: its ==, hash and repr are Value's, not compiled for it
    params = Shapes.__dataclass_params__  # type: ignore[attr-defined]
    assert (params.init, params.frozen, params.repr, params.eq) == (True, True, False, False)
    one = Shapes(1, tags=["a"])
    assert dataclasses.replace(one, size=2) == Shapes(2, tags=["a"])
    assert one == Shapes(1, tags=["a"], strict=True) != Shapes(1)
    assert dataclasses.asdict(one) == dataclasses.asdict(Shapes_(1, tags=["a"]))
    assert pickle.loads(pickle.dumps(one)) == one
    assert one.__reduce_ex__(2)[2] == Shapes_(1, tags=["a"]).__reduce_ex__(2)[2]
    for change in (lambda: setattr(one, "size", 2), lambda: delattr(one, "size")):
        with pytest.raises(FrozenInstanceError, match="field 'size'"):
            change()
    with pytest.raises(FrozenInstanceError, match="field 'other'"):
        one.other = 1  # type: ignore[attr-defined]


def test_a_subclass_reads_as_a_dataclass_subclass() -> None:
    """A plain subclass takes its parent's ``__init__`` and may hold attributes of its own;
    one with its own ``__init__`` shows its own signature; a frozen dataclass subclass
    compiles as before."""

    class Plain(Shapes):
        pass

    class Own(Shapes):
        def __init__(self, size: int) -> None:
            super().__init__(size, "own")

    @dataclass(frozen=True)
    class More(Shapes):
        extra: int = 0

    plain = Plain(1)
    plain.other = 1  # type: ignore[attr-defined]
    with pytest.raises(FrozenInstanceError):
        plain.size = 2
    assert inspect.signature(Plain) == inspect.signature(Shapes)
    assert str(inspect.signature(Own)) == "(size: 'int') -> 'None'"
    assert Own(3).label == "own"
    assert More(1, extra=2).extra == 2 and dataclasses.replace(More(1), extra=3).extra == 3
    with pytest.raises(TypeError, match="__init__\\(\\) missing 1 required positional"):
        Plain()  # type: ignore[call-arg]


def _public_values() -> list[type]:
    for m in pkgutil.walk_packages(tether.__path__, "tether."):
        if m.name.endswith("__main__") or m.name.startswith(
            ("tether.integrations.", "tether.bench", "tether.serve")
        ):
            continue
        importlib.import_module(m.name)
    return sorted(_frozen._MADE, key=lambda c: f"{c.__module__}.{c.__qualname__}")


@pytest.mark.parametrize("cls", _public_values(), ids=lambda c: c.__qualname__)
def test_each_public_value_has_its_dataclass_signature_and_errors(cls: type) -> None:
    """``Outcome``, ``Usage``, ``Verdict``, ... show the signature and raise the errors of the
    frozen dataclass with their fields (a twin made by ``dataclasses``)."""
    fields = dataclasses.fields(cls)
    shape = {"default", "default_factory", "init", "kw_only"}
    specs = [(f.name, f.type, field(**{k: getattr(f, k) for k in shape})) for f in fields]
    twin = dataclasses.make_dataclass(cls.__name__, specs, frozen=True, slots=True)
    assert inspect.signature(cls) == inspect.signature(twin)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(")  # no signature made
    wrong: list[Callable[[type], Any]] = [
        lambda c: c(*range(40)),
        lambda c: c(no_such_field=1),
    ]
    for call in wrong:
        errors = []
        for c in (cls, twin):
            with pytest.raises(TypeError) as caught:
                call(c)
            errors.append(str(caught.value))
        assert errors[0] == errors[1]


def test_a_value_without_a_docstring_gets_the_dataclass_one() -> None:
    """As a dataclass does: its name and signature."""

    @frozen_dataclass
    class Bare(Value):
        size: int
        label: str = ""

    @dataclass(frozen=True)
    class Bare_:
        size: int
        label: str = ""

    assert Bare.__doc__ == Bare_.__doc__.replace("Bare_", "Bare")  # type: ignore[union-attr]
