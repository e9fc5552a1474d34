"""The tool-call pipeline of a run: checks -> breaker -> retry -> ledger -> result,
driven in both shells over one set of decisions."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Unpack

from tether._errors import ControlSignal
from tether.run._hung import HungTools
from tether.run._options import ToolOptions
from tether.run._runstate import RunState
from tether.run._tool import _is_async
from tether.run._tooldecisions import ToolDecisions
from tether.run._toolgate import ToolGate
from tether.run._toolkit import (
    _aattempt_span,
    _acarried,
    _arguments,
    _attempt_span,
    _Call,
    _carried,
    _not_awaitable,
    _paths,
    _Progress,
    _repeat_cap,
    _tool_span,
)

__all__ = ["ToolPipeline"]


#: The keywords call_tool and acall_tool take (checked: ``**options`` accepts any name).
_OPTION_NAMES = frozenset(ToolOptions.__optional_keys__)


class ToolPipeline:
    """Calls a tool under every guard (a part of :class:`tether.Run`): the sync and the
    async driver over the shared decisions, the governance and the hung-tool watch."""

    def __init__(self, state: RunState) -> None:
        self.s = state
        self.hung = HungTools(state)
        self.decide = ToolDecisions(state, self.hung)
        self.gate = ToolGate(state, self.decide)

    def _checked(
        self,
        name: str,
        fn: Callable[..., Any],
        args: Mapping[str, Any] | None,
        options: ToolOptions,
        carried: Callable[[Callable[..., Any], object], Callable[..., Any]],
    ) -> tuple[_Call, Callable[[], None] | None, bool, dict[str, Any], Callable[..., Any]]:
        """What both drivers do before the attempt: the arguments and options checked, the
        run's checks, the policies and the approval. Returns the call, its gate (None: no
        approval governs it), whether it is idempotent, its arguments and its function."""
        if not options.keys() <= _OPTION_NAMES:  # a misspelt keyword must not pass silently
            unknown = ", ".join(repr(k) for k in sorted(options.keys() - _OPTION_NAMES))
            raise TypeError(f"call_tool() got an unexpected keyword argument {unknown}")
        arguments = _arguments(name, args)
        self.decide._label(name, options.get("label"))
        timeout, idempotent = options.get("timeout"), options.get("idempotent", True)
        cap = _repeat_cap(name, options.get("allow_repeat"))
        fn = carried(fn, options.get("passthrough", ()))
        volatile = _paths(name, options.get("volatile", ()))
        call = self.decide._before_tool(name, arguments, timeout, idempotent, volatile, cap)
        compensate = options.get("compensate")
        gate = self.gate._govern(call, options.get("requires_approval", False), compensate)
        call, idempotent = self.gate._gated(call, gate, idempotent, timeout)
        return call, gate, idempotent, arguments, fn

    def call(
        self,
        name: str,
        fn: Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        **options: Unpack[ToolOptions],
    ) -> Any:
        """The sync driver of :meth:`tether.Run.call_tool`."""
        if _is_async(fn):
            raise TypeError(
                f"tool {name!r} is a coroutine function: call it with `await run.acall_tool(...)`"
                " (call_tool would never await it, and the tool would never run)"
            )
        call, gate, idempotent, args, fn = self._checked(name, fn, args, options, _carried)
        timeout, lookup = options.get("timeout"), options.get("lookup")
        compensate = options.get("compensate")
        if gate is None:
            attempt = _attempt_span(name, lambda: _not_awaitable(name, fn(**args)))
        else:

            def approved() -> Any:  # runs once the ledger's claim is won
                gate()
                return _not_awaitable(name, fn(**args))

            attempt = _attempt_span(name, approved)
        health = self.hung._watch(call, idempotent)
        if health is not None:
            attempt = health.sync(functools.partial(self.hung._refuse_unresponsive, call), attempt)
        run = self.decide._effect(call, attempt, idempotent, lookup, timeout)
        progress = None if idempotent else _Progress()
        if progress is not None:
            run = functools.partial(progress.run, run)
        with _tool_span(name, self.s.run_id):
            try:
                if health is not None:
                    self.hung._refuse_unresponsive(call, before=True)
                result = self.s.through_breaker(
                    lambda: self.hung._unless_unresponsive(
                        call, lambda: call.policy.call_within(self.s.time_left(), run)
                    ),
                    timeout=timeout,
                )
            except ControlSignal as carried:  # the framework's own control flow
                self.decide._not_made()
                raise carried.signal from None
            except Exception as exc:
                raise self.decide._after_failure(call, exc) from exc
            except BaseException:  # KeyboardInterrupt, SystemExit
                self.decide._interrupted(call, progress, idempotent, compensate)
                raise
        return self.decide._after_success(call, result, idempotent, compensate)

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]] | Callable[..., Any],
        args: Mapping[str, Any] | None = None,
        **options: Unpack[ToolOptions],
    ) -> Any:
        """The async driver of :meth:`tether.Run.acall_tool` (a hanging attempt is cancelled)."""
        call, gate, idempotent, args, fn = self._checked(name, fn, args, options, _acarried)
        timeout, lookup = options.get("timeout"), options.get("lookup")
        compensate = options.get("compensate")
        attempt: Callable[[], Awaitable[Any]]
        progress = None if idempotent else _Progress()
        health = self.hung._watch(call, idempotent)
        check = functools.partial(self.hung._refuse_unresponsive, call)
        if _is_async(fn):

            async def attempt() -> Any:
                if gate is not None:
                    gate()  # the ledger's claim is won
                return await fn(**args)

            attempt = _aattempt_span(name, attempt)
            if health is not None:
                attempt = health.coro(check, attempt)

            if progress is not None:
                ledger, key, lease = (
                    self.s.guard.ledger,
                    self.decide._effect_key(call),
                    self.decide._lease(timeout),
                )
                coro = functools.partial(progress.arun, attempt)  # what the ledger runs

                async def attempt() -> Any:
                    return await ledger.aonce(
                        key,
                        coro,
                        lookup=lookup,
                        lease=lease,
                        timeout=self.decide._effect_timeout(timeout),
                    )
        else:

            def body() -> Any:
                if gate is not None:
                    gate()
                return _not_awaitable(name, fn(**args))

            sync = self.decide._effect(call, _attempt_span(name, body), idempotent, lookup, timeout)
            if progress is not None:
                sync = functools.partial(progress.run, sync)

            if health is not None:
                attempt = health.threaded(check, sync)
            else:

                async def attempt() -> Any:
                    import asyncio  # imported when first used: `import tether` loads no asyncio

                    return await asyncio.to_thread(sync)

        with _tool_span(name, self.s.run_id):
            try:
                if health is not None:
                    self.hung._refuse_unresponsive(call, before=True)
                result = await self.s.athrough_breaker(
                    lambda: self.hung._aunless_unresponsive(
                        call, lambda: call.policy.acall_within(self.s.time_left(), attempt)
                    ),
                    timeout=timeout,
                )
            except ControlSignal as carried:
                self.decide._not_made()
                raise carried.signal from None
            except Exception as exc:
                raise self.decide._after_failure(call, exc) from exc
            except BaseException:  # cancelled
                self.decide._interrupted(call, progress, idempotent, compensate)
                raise
        return self.decide._after_success(call, result, idempotent, compensate)
