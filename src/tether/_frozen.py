"""Frozen values for tether's own use: compared, hashed, shown and pickled as a frozen
dataclass is, without its cost at import.

A dataclass compiles its methods when its module is imported (2-5 M instructions each on
Python 3.11, most of a guarded run's first start). A value that only tether makes and
reads (a store's configuration, a call's options) is a plain slots class on
:class:`Frozen` instead, with a hand-written ``__init__``. A public value stays a
dataclass (users ``dataclasses.replace`` it, read its ``fields`` and compare it), made with
``repr=False, eq=False`` on :class:`Value`, which gives it the ``==``, ``hash`` and ``repr``
the dataclass would have compiled: half of a frozen dataclass's cost at import.
"""

from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import FrozenInstanceError
from typing import Any, ClassVar, NoReturn

__all__ = ["Frozen", "Value", "set_fields"]


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


#: each Value class's fields: (compared, hashed, shown), read on first use
_NAMES: dict[type, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {}


def _names(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    try:
        return _NAMES[cls]
    except KeyError:
        fields = dataclasses.fields(cls)
        names = _NAMES[cls] = (
            tuple(f.name for f in fields if f.compare),
            tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)),
            tuple(f.name for f in fields if f.repr),
        )
        return names


class Value:
    """The ``==``, ``hash`` and ``repr`` of a frozen dataclass, for one made with
    ``@dataclass(frozen=True, slots=True, repr=False, eq=False)`` on this base: the same
    methods as the dataclass would compile for itself (Python 3.11 compiles each one per
    class, at import), read from its fields.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        names = _names(self.__class__)[0]
        return tuple([getattr(self, n) for n in names]) == tuple([getattr(other, n) for n in names])

    def __hash__(self) -> int:
        return hash(tuple([getattr(self, n) for n in _names(self.__class__)[1]]))

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in _names(self.__class__)[2])
        return f"{self.__class__.__qualname__}({shown})"
