"""The tool-call pipeline of a run: checks -> breaker -> retry -> ledger -> result,
driven in both shells over one set of decisions."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tether import telemetry
from tether._errors import ControlSignal
from tether.run._health import ToolHealth
from tether.run._hung import HungTools
from tether.run._options import ToolOptions
from tether.run._outcome import StopReason
from tether.run._runstate import (
    RunState,
    call_over,
    escalate,
    refer_effect,
)
from tether.run._tooldecisions import ToolDecisions, _ARan
from tether.run._toolfn import _is_async, check_reference
from tether.run._toolgate import ToolGate
from tether.run._toolkit import (
    NO_OPTIONS,
    _aattempt_span,
    _acarried,
    _arguments,
    _attempt_span,
    _Call,
    _carried,
    _not_awaitable,
    _Options,
    _paths,
    _Progress,
    _repeat_cap,
    _signals,
    _tool_span,
    declined,
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
    ) -> tuple[
        _Call, Callable[[], None] | None, bool, dict[str, Any], Callable[..., Any], _Options
    ]:
        """What both drivers do before the attempt: the arguments and options checked, the
        run's checks, the policies and the approval. Returns the call, its gate (None: no
        approval governs it), whether it is idempotent, its arguments, its function and
        its options."""
        if options and not options.keys() <= _OPTION_NAMES:  # a misspelt keyword must not pass
            unknown = ", ".join(repr(k) for k in sorted(options.keys() - _OPTION_NAMES))
            raise TypeError(f"call_tool() got an unexpected keyword argument {unknown}")
        arguments = _arguments(name, args)
        opts = self._options(name, options) if options else NO_OPTIONS
        if opts.passthrough:
            fn = carried(fn, opts.passthrough)
        idempotent = opts.idempotent
        call = self.decide._before_tool(
            name, arguments, opts.timeout, idempotent, opts.volatile, opts.allow_repeat
        )
        try:
            gate = self.gate._govern(call, opts.requires_approval, opts.compensate)
            if gate is not None:
                call, idempotent = self.gate._gated(call, gate, idempotent, opts.timeout)
        except BaseException:  # refused by a policy, waiting for a person: not under way
            call_over(self.s, call.action)
            raise
        return call, gate, idempotent, arguments, fn, opts

    def _options(self, name: str, options: ToolOptions) -> _Options:
        """A call's options checked, each error naming the tool (in the order of the
        keywords' checks; a label is the run's from here on)."""
        self.decide._label(name, options.get("label"))
        if "reference" in options:  # the field of its result (or a function) that is its reference
            reference = options["reference"]
            check_reference(name, reference)
            refer_effect(self.s, name, reference)
        hands_over = options.get("hands_over", False)
        if not isinstance(hands_over, bool):
            raise TypeError(
                f"hands_over of tool {name!r} must be True or False, got {hands_over!r}"
            )
        return _Options(
            timeout=options.get("timeout"),
            idempotent=options.get("idempotent", True),
            lookup=options.get("lookup"),
            requires_approval=options.get("requires_approval", False),
            compensate=options.get("compensate"),
            allow_repeat=_repeat_cap(name, options.get("allow_repeat")),
            passthrough=_signals(options.get("passthrough", ())),
            volatile=_paths(name, options.get("volatile", ())),
            hands_over=hands_over,
        )

    def _handed_over(self, call: _Call) -> None:
        """A hand-over tool ran: the customer is a person's now. The run ends (at the next
        step, so that the tool's result is in the conversation) ``"escalated"``, its handoff
        filed as a case."""
        escalate(self.s)
        self.s._halt(StopReason.HANDED_OVER, f"{call.name} handed the customer to a person")

    def call(
        self,
        name: str,
        fn: Callable[..., Any],
        args: Mapping[str, Any] | None,
        options: ToolOptions,
    ) -> Any:
        """The sync driver of :meth:`tether.Run.call_tool` (``options``: its keywords, the
        dict the call collected, not unpacked again)."""
        if _is_async(fn):
            raise TypeError(
                f"tool {name!r} is a coroutine function: call it with `await run.acall_tool(...)`"
                " (call_tool would never await it, and the tool would never run)"
            )
        call, gate, idempotent, args, fn, opts = self._checked(name, fn, args, options, _carried)
        timeout = opts.timeout
        recording = telemetry.enabled()  # while nothing records, the spans cost this check
        if gate is None:
            attempt = lambda: _not_awaitable(name, fn(**args))  # noqa: E731 - the attempt
        else:

            def approved() -> Any:  # runs once the ledger's claim is won
                gate()
                return _not_awaitable(name, fn(**args))

            attempt = approved
        if recording:
            attempt = _attempt_span(name, attempt)
        # an untimed call has no health to watch (the usual read: no look-up)
        health = None if call.policy.attempt_timeout is None else self.hung._watch(call, idempotent)
        if health is not None:
            attempt = health.sync(functools.partial(self.hung._refuse_unresponsive, call), attempt)
        progress = None
        if not idempotent:
            attempt = self.decide._effect(call, attempt, idempotent, opts.lookup, timeout)
            progress = _Progress()
            attempt = functools.partial(progress.run, attempt)
        if recording:
            with _tool_span(name, self.s.run_id):
                result = self._made(call, attempt, health, timeout, progress, opts.compensate)
        else:
            result = self._made(call, attempt, health, timeout, progress, opts.compensate)
        result = self.decide._after_success(call, result, idempotent, opts.compensate)
        if opts.hands_over:
            self._handed_over(call)
        return result

    def _made(
        self,
        call: _Call,
        attempt: Callable[[], Any],
        health: ToolHealth | None,
        timeout: float | None,
        progress: _Progress | None,
        compensate: Any,
    ) -> Any:
        """The call made through the breaker and its retry policy (in the tool's span, when
        one records); a failure becomes what the caller gets (Stopped or ToolError)."""
        try:
            if health is not None:
                self.hung._refuse_unresponsive(call, before=True)
            # completed: the call leaves the flight when it is recorded (_after_success)
            within = functools.partial(self.hung._within, call, attempt)  # no frame of its own
            return self.s.through_breaker(within, timeout=timeout)
        except ControlSignal as carried:  # the framework's own control flow
            self.decide._not_made(call)  # its slot given back
            raise carried.signal from None
        except Exception as exc:  # the call leaves the flight as its failure is counted
            raise self.decide._after_failure(call, exc, flying=True) from exc
        except BaseException:  # KeyboardInterrupt, SystemExit
            # progress is None: an idempotent call (an effect's progress is watched)
            self.decide._interrupted(call, progress, progress is None, compensate)
            raise

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]] | Callable[..., Any],
        args: Mapping[str, Any] | None,
        options: ToolOptions,
    ) -> Any:
        """The async driver of :meth:`tether.Run.acall_tool` (a hanging attempt is cancelled)."""
        call, gate, idempotent, args, fn, opts = self._checked(name, fn, args, options, _acarried)
        timeout, lookup = opts.timeout, opts.lookup
        recording = telemetry.enabled()  # while nothing records, the spans cost this check
        attempt: Callable[[], Awaitable[Any]]
        progress = None if idempotent else _Progress()
        health = self.hung._watch(call, idempotent)
        check = functools.partial(self.hung._refuse_unresponsive, call)
        if _is_async(fn):

            async def attempt() -> Any:
                if gate is not None:
                    gate()  # the ledger's claim is won
                return declined(await fn(**args))

            if recording:
                attempt = _aattempt_span(name, attempt)
            if health is not None:
                attempt = health.coro(check, attempt)

            if progress is not None:
                coro = functools.partial(progress.arun, attempt)  # what the ledger runs
                attempt = _ARan(self.decide, call, coro, lookup, timeout)
        else:

            def body() -> Any:
                if gate is not None:
                    gate()
                return _not_awaitable(name, fn(**args))

            sync = _attempt_span(name, body) if recording else body
            sync = self.decide._effect(call, sync, idempotent, lookup, timeout)
            if progress is not None:
                sync = functools.partial(progress.run, sync)

            if health is not None:
                attempt = health.threaded(check, sync)
            else:

                async def attempt() -> Any:
                    import asyncio  # imported when first used: `import tether` loads no asyncio

                    return await asyncio.to_thread(sync)

        if recording:
            with _tool_span(name, self.s.run_id):
                result = await self._amade(
                    call, attempt, health, timeout, progress, opts.compensate
                )
        else:
            result = await self._amade(call, attempt, health, timeout, progress, opts.compensate)
        result = self.decide._after_success(call, result, idempotent, opts.compensate)
        if opts.hands_over:
            self._handed_over(call)
        return result

    async def _amade(
        self,
        call: _Call,
        attempt: Callable[[], Awaitable[Any]],
        health: ToolHealth | None,
        timeout: float | None,
        progress: _Progress | None,
        compensate: Any,
    ) -> Any:
        """The async form of :meth:`_made` (cancelled: what the call left is settled)."""
        try:
            if health is not None:
                self.hung._refuse_unresponsive(call, before=True)
            # completed: the call leaves the flight when it is recorded (_after_success)
            return await self.s.athrough_breaker(
                lambda: self.hung._awithin(call, attempt), timeout=timeout
            )
        except ControlSignal as carried:
            self.decide._not_made(call)  # its slot given back
            raise carried.signal from None
        except Exception as exc:  # the call leaves the flight as its failure is counted
            raise self.decide._after_failure(call, exc, flying=True) from exc
        except BaseException:  # cancelled
            # progress is None: an idempotent call (an effect's progress is watched)
            self.decide._interrupted(call, progress, progress is None, compensate)
            raise
