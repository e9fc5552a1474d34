"""The pieces of one tool call: its checked context, its arguments, its attempt spans,
the words the model gets (shared by both drivers of :mod:`tether.run._toolcall`)."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from tether import telemetry
from tether._errors import ControlSignal, Declined
from tether._frozen import Frozen, set_fields
from tether.effects._canonical import digest
from tether.records import _approvals as gov
from tether.records._approvals import ApprovalRecord
from tether.redaction._redact import REDACTED, masks_pii, redact
from tether.retries._policy import RetryPolicy
from tether.run._toolfn import _is_async

#: An intent approved and used this many times in one run asks no more (a loop).
MAX_APPROVALS_PER_INTENT = 20

UNAVAILABLE = "temporarily unavailable; try again later or continue without it"
REJECTED = "rejected: the tool could not do this; do not call it again with the same arguments"
QUOTA_REACHED = "unavailable: a usage limit was reached; do not call it again in this conversation"
NOT_ANSWERING = "unavailable: it is not answering; do not call it again in this conversation"


def _said(text: str) -> str:
    """A tool's own message for the model: its first line, redacted (personal data masked,
    unless ``register_secrets(mask_pii=False)``), at most 300 characters."""
    first = text.strip().splitlines()[0] if text.strip() else "the tool refused"
    return str(redact(first, pii=masks_pii()))[:300]


class _Call:
    """The checked context of one tool call (made on every call: a plain slots class,
    whose constructor assigns its fields, where a frozen one would go through
    ``object.__setattr__`` for each). Nothing changes it once made but the ledger's notes
    on this call (``runs``: attempts in which the ledger ran the tool; ``replayed``: its
    last answer was a recorded outcome, the tool not run), kept on the call itself so
    that two calls of one intent under way at once never read each other's."""

    __slots__ = (
        "_key",
        "action",
        "allow_repeat",
        "args",
        "encoded",
        "name",
        "policy",
        "replayed",
        "runs",
        "scope",
        "step",
        "strings",
        "text",
    )

    def __init__(
        self,
        name: str,
        args: Any,
        action: str,  # the intent: what the loop checks compare
        key: str | None,  # the ledger's key (None: made from ``encoded`` when first asked for)
        step: int,
        policy: RetryPolicy,
        allow_repeat: int | None = None,  # this call's own repeat cap (a read-only tool's polling)
        text: str | None = None,  # the arguments' canonical JSON, when it holds all of them
        strings: list[str] | None = None,  # the keys and string values of that text
        encoded: str = "",  # the canonical text the intent was made from
        scope: str = "",  # the run's scope, that the ledger's key holds
    ) -> None:
        self.name = name
        self.args = args
        self.action = action
        self._key = key
        self.step = step
        self.policy = policy
        self.allow_repeat = allow_repeat
        self.text = text
        self.strings = strings
        self.encoded = encoded
        self.scope = scope
        self.runs = 0
        self.replayed = False

    @property
    def key(self) -> str:
        """The ledger's key: the intent, scoped by the run's scope when it has one (made
        when first asked for: a read's call that succeeds never needs it)."""
        key = self._key
        if key is None:
            key = self._key = (
                digest(self.name, self.encoded, self.scope) if self.scope else self.action
            )
        return key

    def under(self, policy: RetryPolicy) -> _Call:
        """The same call under another retry policy."""
        return _Call(
            self.name, self.args, self.action, self._key, self.step, policy,
            self.allow_repeat, self.text, self.strings, self.encoded, self.scope,
        )  # fmt: skip


class _Options(Frozen):
    """The options of one call, checked (see :meth:`tether.Run.call_tool`)."""

    __slots__ = _fields = (
        "timeout",
        "idempotent",
        "lookup",
        "requires_approval",
        "compensate",
        "volatile",
        "allow_repeat",
        "passthrough",
        "hands_over",
    )
    timeout: float | None
    idempotent: bool
    lookup: Callable[[str], Any] | None
    requires_approval: Any
    compensate: Any
    volatile: tuple[str, ...]
    allow_repeat: int | None
    passthrough: tuple[type[BaseException], ...]
    hands_over: bool

    def __init__(
        self,
        timeout: float | None = None,
        idempotent: bool = True,
        lookup: Callable[[str], Any] | None = None,
        requires_approval: Any = False,
        compensate: Any = None,
        volatile: tuple[str, ...] = (),
        allow_repeat: int | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
        hands_over: bool = False,
    ) -> None:
        set_fields(
            self,
            timeout,
            idempotent,
            lookup,
            requires_approval,
            compensate,
            volatile,
            allow_repeat,
            passthrough,
            hands_over,
        )


#: a call without options: nothing to check (most calls)
NO_OPTIONS = _Options()


def _tool_span(name: str, run_id: str) -> AbstractContextManager[Any]:
    """The ``tether.tool_call`` span of a call (made only while telemetry records: the
    driver checked once, :func:`tether.telemetry.enabled`)."""
    return telemetry.span("tether.tool_call", **{"gen_ai.tool.name": name, "tether.run_id": run_id})


def _repeat_cap(name: str, cap: int | None) -> int | None:
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise ValueError(f"allow_repeat of tool {name!r} must be an int >= 1 or None, got {cap!r}")
    return cap


def _signals(passthrough: object) -> tuple[type[BaseException], ...]:
    if not isinstance(passthrough, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in passthrough
    ):
        raise TypeError(f"passthrough must be a tuple of exception types, got {passthrough!r}")
    return passthrough


def _carried(fn: Callable[..., Any], passthrough: object) -> Callable[..., Any]:
    """``fn`` whose control-flow exceptions travel as :class:`ControlSignal`."""
    signals = _signals(passthrough)
    if not signals:
        return fn

    @functools.wraps(fn)
    def carried(**args: Any) -> Any:
        try:
            return fn(**args)
        except signals as exc:
            raise ControlSignal(exc) from None

    return carried


def _acarried(fn: Callable[..., Any], passthrough: object) -> Callable[..., Any]:
    signals = _signals(passthrough)
    if not signals:
        return fn
    if not _is_async(fn):
        return _carried(fn, signals)

    @functools.wraps(fn)
    async def carried(**args: Any) -> Any:
        try:
            return await fn(**args)
        except signals as exc:
            raise ControlSignal(exc) from None

    return carried


class _Progress:
    """How far one non-idempotent call got, for a cancellation to tell.

    ``running`` while an attempt of the effect is under way (the effect itself, or, run
    in a worker thread, the whole ledger call, which goes on to its end once it began);
    ``returned`` once one gave a result. An attempt that raised is settled by the ledger
    (released, failed or unknown) and is no longer running; its ``error`` says which. Once
    the caller gave up, a worker thread that had not begun yet never does. An attempt sets
    its result or error before it stops ``running``: read ``running`` first.
    """

    __slots__ = ("_lock", "_off", "error", "result", "returned", "running")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._off = self.running = self.returned = False
        self.result: Any = None
        self.error: Exception | None = None

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._off:
                return None  # the caller was cancelled before this thread began
            self.running = True
        try:
            result = fn()
        except Exception as exc:
            self.error, self.running = exc, False
            raise
        self.result, self.returned, self.running = result, True, False
        return result

    async def arun(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        self.running = True
        try:
            result = await fn()
        except Exception as exc:
            self.error, self.running = exc, False
            raise
        self.result, self.returned, self.running = result, True, False
        return result

    def give_up(self) -> None:
        with self._lock:
            self._off = True


def _already_claimed() -> None:
    """A call the ledger knows already: no approval to mark (the ledger replays it)."""


def _current_approval(approvals: Any, base: str) -> tuple[str | None, ApprovalRecord | None]:
    """The record that decides this intent's next call: the first not used up (None: not
    asked yet); ``(None, None)`` when MAX_APPROVALS_PER_INTENT were used."""
    for n in range(MAX_APPROVALS_PER_INTENT):
        record_id = base if n == 0 else f"{base}.{n}"
        record = approvals.get(record_id)
        if record is None or record.status != gov.USED:
            return record_id, record
    return None, None


class ReturnedAwaitable(TypeError):
    """A tool's plain function returned an awaitable: a mistake of the code, raised to it
    (never retried, never shown to the model), in both shells."""


def _not_awaitable(name: str, result: Any) -> Any:
    """One behaviour for both shells: a plain function that returns an awaitable is
    refused (the coroutine is closed, never started: nothing ran). Declare the tool
    ``async def`` and call it with ``await run.acall_tool(...)``."""
    if type(result) in _NEVER_AWAITABLE:
        return result
    if isinstance(result, Declined):  # returned, not raised: the same "no"
        raise result
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never started: nothing ran
        raise ReturnedAwaitable(
            f"tool {name!r} is a plain function that returned an awaitable: declare it "
            "`async def` and call it with `await run.acall_tool(...)`"
        )
    return result


def declined(result: Any) -> Any:
    """An async tool's result: a returned :class:`tether.Declined` is raised (nothing was
    done), as a raised one is."""
    if type(result) not in _NEVER_AWAITABLE and isinstance(result, Declined):
        raise result
    return result


#: the exact types a tool's result most often has, none of them awaitable (the check
#: above then costs no look-up of ``inspect.isawaitable``'s ABCs)
_NEVER_AWAITABLE = frozenset({dict, list, tuple, str, int, float, bool, bytes, type(None)})


def _paths(name: str, volatile: Any) -> tuple[str, ...]:
    """A tool's declared volatile paths, as a tuple (a single string is refused: it would
    read as its letters)."""
    if not volatile:
        return ()
    if isinstance(volatile, str):
        raise TypeError(
            f"volatile of tool {name!r} takes a list of paths, e.g. "
            f"volatile=[{volatile!r}], got the string {volatile!r}"
        )
    return tuple(volatile)


def _arguments(name: str, args: Any) -> dict[str, Any]:
    if type(args) is dict:  # the usual case: no ABC look-up
        return args.copy()
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise TypeError(
            f"args of tool {name!r} must be a mapping of argument names to values "
            f"(passed as fn(**args)), got a {type(args).__name__}: {args!r:.80}"
        )
    return dict(args)


def _aattempt_span(name: str, fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """The async form of :func:`_attempt_span`: the same spans for an awaited attempt."""
    attempts = [0]

    async def attempt() -> Any:
        attempts[0] += 1
        telemetry.record_attempt(name, attempts[0])
        with telemetry.span(
            "tether.attempt", **{"gen_ai.tool.name": name, "tether.attempt": attempts[0]}
        ):
            return await fn()

    return attempt


def _attempt_span(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """Each attempt of a tool call as a ``tether.attempt`` span (made only while telemetry
    records: the driver checked once)."""
    attempts = [0]

    def attempt() -> Any:
        attempts[0] += 1
        telemetry.record_attempt(name, attempts[0])
        with telemetry.span(
            "tether.attempt", **{"gen_ai.tool.name": name, "tether.attempt": attempts[0]}
        ):
            return fn()

    return attempt


def _holds_placeholder(value: Any) -> bool:
    """Whether a value holds the redaction placeholder anywhere (cheap: a walk, no paths;
    at most 100,000 values are looked at, so a self-containing value cannot loop)."""
    stack = [value]
    budget = 100_000
    while stack and budget:
        budget -= 1
        item = stack.pop()
        kind = type(item)
        if kind is dict or (kind not in _SCALARS and isinstance(item, Mapping)):
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is str or (kind not in _SCALARS and isinstance(item, str)):
            if REDACTED in item:
                return True
        elif kind not in _SCALARS and isinstance(item, list | tuple):
            stack.extend(item)
    return False


_SCALARS = frozenset({int, float, bool, type(None)})
