"""Frozen values for tether's own use: compared, hashed, shown and pickled as a frozen
dataclass is, without its cost at import.

A dataclass compiles its methods when its module is imported (2-5 M instructions each on
Python 3.11, most of a guarded run's first start). A value that only tether makes and
reads (a store's configuration, a call's options) is a plain slots class on
:class:`Frozen` instead, with a hand-written ``__init__``. A public value stays a
dataclass: users ``dataclasses.replace`` it, read its ``fields`` and compare it.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any, ClassVar, NoReturn

__all__ = ["Frozen", "set_fields"]


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
