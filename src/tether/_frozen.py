"""Frozen values for tether's own use: compared, hashed, shown and pickled as a frozen
dataclass is, without its cost at import.

A dataclass compiles its methods when its module is imported (about 1 M instructions each
on Python 3.11, most of a guarded run's first start). A value that only tether makes and
reads (a store's configuration, a call's options) is a plain slots class on
:class:`Frozen` instead, with a hand-written ``__init__``. A public value stays a
dataclass (users ``dataclasses.replace`` it, read its ``fields`` and compare it), made with
:func:`frozen_dataclass` on :class:`Value`, which gives it the ``__init__``, ``==``, ``hash``,
``repr`` and frozen ``__setattr__`` the dataclass would have compiled, read from its fields.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError
from typing import Any, ClassVar, NoReturn, TypeVar, dataclass_transform

__all__ = ["Frozen", "Value", "frozen_dataclass", "set_fields"]


class Frozen:
    """A value of named fields (``_fields``, also its ``__slots__``), set once.

    ``==`` compares values of the same class, ``hash`` hashes the values, ``repr`` reads
    ``Name(field=value, ...)``, assigning raises ``dataclasses.FrozenInstanceError``, as
    for a frozen dataclass.
    """

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__ or not isinstance(other, Frozen):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({shown})"

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._values()


def set_fields(value: Frozen, *values: Any) -> None:
    """Set ``value``'s fields, in the order of its ``_fields`` (its ``__init__``'s work)."""
    for name, field in zip(value._fields, values, strict=True):
        object.__setattr__(value, name, field)


#: a value class is made often once it has been constructed this many times: it gets the
#: ``__init__`` its dataclass would have compiled, twice as fast, paid for once (compiling
#: costs about what 200-300 constructions save, on Python 3.11)
HOT = 250

_set = object.__setattr__

_T = TypeVar("_T")

#: the classes :func:`frozen_dataclass` made (a class of them owns its fields: ``type(self) is cls``)
_MADE: set[type] = set()


class _Plan:
    """What the shared methods of one value class read of its fields (made on first use)."""

    __slots__ = (
        "accepted",
        "compared",
        "exact",
        "hashed",
        "made",
        "names",
        "owner",
        "positional",
        "post_init",
        "required",
        "shown",
        "steps",
    )

    def __init__(self, owner: type) -> None:
        fields = dataclasses.fields(owner)
        init = [f for f in fields if f.init]
        self.owner = owner
        self.compared = tuple(f.name for f in fields if f.compare)
        self.hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        self.shown = tuple(f.name for f in fields if f.repr)
        self.names = frozenset(f.name for f in fields)
        self.positional = tuple(f.name for f in init if not f.kw_only)
        self.accepted = frozenset(f.name for f in init)
        self.required = tuple(
            f.name for f in init if f.default is MISSING and f.default_factory is MISSING
        )
        # what __init__ sets, in the fields' order: (name, an argument, default, factory)
        self.steps: tuple[tuple[str, bool, Any, Any], ...] = tuple(
            (f.name, f.init, f.default, f.default_factory)
            for f in fields
            if f.init or f.default is not MISSING or f.default_factory is not MISSING
        )
        self.post_init = hasattr(owner, "__post_init__")
        self.exact: Callable[..., None] | None = None
        # an InitVar or ClassVar (not in fields()): the dataclass's own __init__ from the start
        self.made = 0 if len(owner.__dataclass_fields__) == len(fields) else HOT  # type: ignore[attr-defined]

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The arguments by field name, or None for a call the dataclass's own ``__init__``
        takes (a wrong one, to raise its error; every call once the class is made often)."""
        self.made += 1
        positional = self.positional
        if self.made > HOT or len(args) > len(positional):
            return None
        given = dict(zip(positional, args, strict=False))
        for name in kwargs:
            if name in given or name not in self.accepted:
                return None
        given.update(kwargs)
        for name in self.required:
            if name not in given:
                return None
        return given

    def exact_init(self) -> Callable[..., None]:
        """The ``__init__`` ``@dataclass(frozen=True)`` compiles for these fields (a twin
        class's, named as the value's, so its errors and signature are the dataclass's)."""
        if self.exact is None:
            owner = self.owner
            fields = owner.__dataclass_fields__  # type: ignore[attr-defined]
            namespace: dict[str, Any] = {
                "__module__": owner.__module__,
                "__qualname__": owner.__qualname__,
                "__annotations__": {name: f.type for name, f in fields.items()},
            }
            for name, f in fields.items():
                namespace[name] = dataclasses.field(
                    default=f.default, default_factory=f.default_factory, init=f.init,
                    kw_only=f.kw_only,
                )  # fmt: skip
            if self.post_init:
                namespace["__post_init__"] = owner.__post_init__  # type: ignore[attr-defined]
            twin = type(owner.__name__, (), namespace)
            twin = dataclasses.dataclass(
                frozen=True, slots=True, repr=False, eq=False, match_args=False
            )(twin)
            self.exact = twin.__dict__["__init__"]
        return self.exact


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    try:
        return _PLANS[cls]
    except KeyError:
        owner = next(c for c in cls.__mro__ if c in _MADE)
        plan = _PLANS[cls] = _PLANS[owner] if owner in _PLANS else _Plan(owner)
        _PLANS[owner] = plan
        return plan


class _Signature:
    """``inspect.signature`` of a value class: its dataclass ``__init__``'s, without ``self``
    (made when first asked); None for a subclass with an ``__init__`` of its own."""

    def __get__(self, instance: object, cls: type) -> Any:
        if not any(c in _MADE for c in cls.__mro__):  # being made: no fields yet
            return None
        plan = _plan(cls)
        init = cls.__init__  # type: ignore[misc]
        if init is not Value.__init__ and init is not plan.exact:
            return None
        import inspect

        signature = inspect.signature(plan.exact_init())
        return signature.replace(parameters=list(signature.parameters.values())[1:])


class Value:
    """The methods of a frozen dataclass, shared by the classes :func:`frozen_dataclass` makes: each
    the same as ``@dataclass(frozen=True, slots=True)`` would compile for that class (Python
    3.11 compiles each one per class, at import), read from its fields. ``__init__`` binds
    its arguments as the dataclass's would; a call it cannot bind goes to the dataclass's
    own ``__init__`` (compiled then), which raises the same error, and so does every call
    once the class is made often (:data:`HOT`)."""

    __slots__ = ()

    __signature__ = _Signature()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        plan = _PLANS.get(self.__class__) or _plan(self.__class__)
        given = plan.bind(args, kwargs)
        if given is None:
            init = plan.exact_init()
            if plan.made > HOT and plan.owner.__init__ is Value.__init__:  # type: ignore[misc]
                setattr(plan.owner, "__init__", init)  # noqa: B010  # made often: its own
            init(self, *args, **kwargs)
            return
        for name, argument, default, factory in plan.steps:
            if argument and name in given:
                _set(self, name, given[name])
            elif default is not MISSING:
                _set(self, name, default)
            else:
                _set(self, name, factory())
        if plan.post_init:
            self.__post_init__()  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        names = _plan(self.__class__).compared
        return tuple([getattr(self, n) for n in names]) == tuple([getattr(other, n) for n in names])

    def __hash__(self) -> int:
        return hash(tuple([getattr(self, n) for n in _plan(self.__class__).hashed]))

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in _plan(self.__class__).shown)
        return f"{self.__class__.__qualname__}({shown})"

    def __setattr__(self, name: str, value: Any) -> None:
        cls = self.__class__
        if cls in _MADE or name in _plan(cls).names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        cls = self.__class__
        if cls in _MADE or name in _plan(cls).names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    def __getstate__(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def __setstate__(self, state: list[Any]) -> None:
        for f, field in zip(dataclasses.fields(self), state, strict=False):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, field)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen_dataclass(cls: type[_T]) -> type[_T]:
    """``@dataclass(frozen=True, slots=True)`` for a :class:`Value` class, compiling none of
    its methods: it shares those of :class:`Value`. A dataclass as before (``fields``,
    ``replace``, ``asdict``, ``__dataclass_params__`` read frozen)."""
    if not issubclass(cls, Value):
        raise TypeError(f"{cls.__qualname__} must subclass tether._frozen.Value")
    docless = not cls.__doc__
    if docless:
        cls.__doc__ = "-"  # written below, from the signature, as the dataclass would
    made = dataclasses.dataclass(init=False, repr=False, eq=False, slots=True)(cls)
    params = made.__dataclass_params__  # type: ignore[attr-defined]
    params.init = params.frozen = True
    _MADE.add(made)
    if docless:
        import inspect

        made.__doc__ = made.__name__ + str(inspect.signature(made)).replace(" -> None", "")
    return made
