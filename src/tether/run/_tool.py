"""A tool the model may call (``tether.Tool``): its function, schema and options."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.effects._canonical import rules
from tether.run._toolfn import _is_async, check_reference

__all__ = ["Tool", "check_reference", "schema_from_hints"]

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (list, tuple, set, frozenset):
        args = typing.get_args(hint)
        schema: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _json_type(args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _json_type(options[0]) if len(options) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    return {}


def schema_from_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON schema of ``fn``'s keyword arguments, from its type hints."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    props: dict[str, Any] = {}
    required = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        props[name] = _json_type(hints.get(name, Any))
        if param.default is param.empty:
            required.append(name)
    return {"type": "object", "properties": props, "required": required}


@dataclass(frozen=True)
class Tool:
    """A tool the model may call, run through ``run.call_tool``.

    ``idempotent=True`` (the default) declares that running it again with the same
    arguments is harmless: a timed-out attempt (which may have completed) is retried, and a
    call the model makes again runs again. A tool with a side effect that must not repeat
    needs ``idempotent=False``: it runs at most once through the guard's ledger (``lookup``
    reads the provider's records when an earlier attempt's outcome is unknown).
    ``requires_approval`` (True, or a predicate of the arguments) stops the run for a
    person's approval of the call before it runs; ``compensate(result)`` undoes a
    completed call when the run is rolled back. ``volatile`` names argument paths the
    model fills anew on every call (``"meta.nonce"``), left out of the call's identity.
    ``label`` is what the customer's message
    calls its effect (``label="refund"``: "Done: refund completed"); tool names stay inside.
    ``hands_over=True``: the model calling it hands the customer to a person (a
    ``transfer_to_human`` tool): the tool runs, then the run ends ``"escalated"``
    (``StopReason.HANDED_OVER``) with a handoff filed as a case, and the customer is told a
    person has it only when one does. ``reference`` names the field of the tool's result
    that the customer reads as the reference of its effect (``reference="refund_id"``:
    "Done: refund completed (reference re_1)"), or is a function of the result; default: its
    ``id``.
    """

    name: str
    fn: Callable[..., Any]
    input_schema: dict[str, Any] | None = None
    description: str = ""
    idempotent: bool = True
    timeout: float | None = None
    lookup: Callable[[str], Any] | None = None
    requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False
    compensate: Callable[[Any], Any] | None = None
    volatile: tuple[str, ...] = ()
    #: what the customer reads for this tool's effect ("refund": "Done: refund completed"),
    #: never the tool's own name; empty: a neutral phrase
    label: str = ""
    #: the model calling it hands the customer to a person: the run ends "escalated"
    hands_over: bool = False
    #: the result's field (or a function of the result) that is its effect's reference
    reference: str | Callable[[Any], Any] | None = None
    schema: dict[str, Any] = field(init=False)

    @property
    def is_async(self) -> bool:
        """Whether ``fn`` is a coroutine function (also behind ``functools.partial`` or an
        async ``__call__``): ``acall_tool`` awaits it, ``call_tool`` refuses it."""
        return _is_async(self.fn)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Tool name must be a non-empty string")
        if not callable(self.fn):
            raise TypeError(f"Tool {self.name!r}: fn must be callable")
        if not isinstance(self.requires_approval, bool) and not callable(self.requires_approval):
            raise TypeError(
                f"Tool {self.name!r}: requires_approval must be a bool or a predicate of the "
                f"arguments, got {self.requires_approval!r}"
            )
        if self.compensate is not None and not callable(self.compensate):
            raise TypeError(
                f"Tool {self.name!r}: compensate must be callable, got {self.compensate!r}"
            )
        if isinstance(self.volatile, str):
            raise TypeError(
                f"Tool {self.name!r}: volatile takes a list of paths, e.g. "
                f"volatile=[{self.volatile!r}]"
            )
        object.__setattr__(self, "volatile", tuple(self.volatile))
        rules(self.volatile)  # a malformed path fails here, naming it
        if not isinstance(self.label, str):
            raise TypeError(f"Tool {self.name!r}: label must be a string, got {self.label!r}")
        if not isinstance(self.hands_over, bool):
            raise TypeError(
                f"Tool {self.name!r}: hands_over must be True or False, got {self.hands_over!r}"
            )
        check_reference(self.name, self.reference)
        schema = self.input_schema if self.input_schema is not None else schema_from_hints(self.fn)
        object.__setattr__(self, "schema", schema)
        if not self.description:
            object.__setattr__(
                self, "description", (inspect.getdoc(self.fn) or self.name).split("\n")[0]
            )
