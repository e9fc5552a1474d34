"""What the SDK integrations share: the guarded client proxy and its streams, the tool rules
of an adapter, model-call retries, and tool results for the model."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import uuid
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, ClassVar, ParamSpec, TypeVar, Unpack, cast

from tether import Fallback, ModelTurn, Run, Tool, telemetry
from tether.guards._breaker import breakers
from tether.guards._tokens import budgets_for
from tether.integrations._fallbacks import acall_chain, call_chain, candidates, check_chain
from tether.integrations._tokens import TokenGate, gate_for
from tether.integrations._tool_options import SideEffects, ToolOptions
from tether.integrations._translate import translation
from tether.providers._usage import RequestUsage, UsageReader, stream_usage
from tether.retries._policy import RetryPolicy

__all__ = [
    "AsyncGuardedStream",
    "Guarded",
    "GuardedStream",
    "SideEffects",
    "Tool",
    "ToolOptions",
    "ToolRules",
    "guarding",
    "take_rules",
    "volatile_paths",
]

_log = logging.getLogger("tether")
T = TypeVar("T")
P = ParamSpec("P")
G = TypeVar("G", bound="Guarded")


def guarding(kind: Callable[P, G], module: str, doc: str) -> Callable[P, G]:
    """A provider module's ``guarded(client, policy=None, run=None, *, token_budget=None,
    fallbacks=None)``: the constructor of its guarded client class, as a function."""

    def guarded(*args: P.args, **kwargs: P.kwargs) -> G:
        return kind(*args, **kwargs)

    guarded.__module__, guarded.__doc__ = module, doc
    signature = inspect.signature(kind).replace(return_annotation=getattr(kind, "__name__", ""))
    guarded.__signature__ = signature  # type: ignore[attr-defined]
    return guarded


def require_guard(guard: Any) -> None:
    """An adapter's ``guard`` is a :class:`tether.Guard` (a clear error at construction,
    not an AttributeError at the first call)."""
    from tether import Guard

    if not isinstance(guard, Guard):
        raise TypeError(f"guard must be a tether.Guard, got {guard!r}")


def require_request_key(key: Any) -> None:
    """An adapter's ``key``: a request id (a non-empty str), a function that names one, or None."""
    if key is not None and not callable(key) and (not isinstance(key, str) or not key.strip()):
        raise ValueError(f"key must be a request id (str), a function, or None, got {key!r}")


def require_a_place_to_wait(guard: Any, needing: Iterable[str]) -> None:
    """Tools that may need a person's approval, and a guard with nowhere to wait for one:
    refused before the first (paid) request, naming the tools and the fix."""
    names = sorted(set(needing))
    if names and guard.checkpoints is None:
        raise ValueError(
            f"{', '.join(names)} may require approval, and this guard has nowhere to wait for "
            "one: pass checkpoints= (or records=) to Guard, e.g. "
            "tether.Checkpoints.sqlite(path); no request was sent"
        )


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether a framework's function is a coroutine function, as a tool's is decided
    (:attr:`tether.Tool.is_async`: also behind ``functools.partial`` or an async
    ``__call__``)."""
    return Tool("fn", fn, input_schema={}).is_async


def require_sync_tools(tools: Sequence[Tool]) -> None:
    """A sync agent loop cannot await a tool: say so before the first (paid) request."""
    for tool in tools:
        if tool.is_async:
            raise TypeError(
                f"tool {tool.name!r} is a coroutine function: the sync run_agent cannot await "
                "it; give it a plain function, or run the agent with arun_agent"
            )


def side_effect_map(side_effects: Any) -> dict[str, Callable[[str], Any] | None]:
    """An adapter's ``side_effects``: a mapping of tool name to its ``lookup`` (or None), or
    an iterable of names; as a mapping."""
    if side_effects is None:
        return {}
    if isinstance(side_effects, Mapping):
        return dict(side_effects)
    if isinstance(side_effects, str):
        raise TypeError("side_effects must be a mapping of tool name to lookup, or a list of names")
    return dict.fromkeys(side_effects)


def _labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """``labels``: what the customer reads for each tool (by tool name), checked."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of tool name to label, got {labels!r}")
    for name, label in labels.items():
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"labels[{name!r}] must be a non-empty string, got {label!r}")
    return dict(labels)


def take_rules(options: dict[str, Any]) -> ToolOptions:
    """The per-tool options among an entry point's keywords (taken out of ``options``; what
    is left goes to the framework)."""
    names = ToolOptions.__optional_keys__
    return cast("ToolOptions", {n: options.pop(n) for n in list(options) if n in names})


def volatile_paths(volatile: Mapping[str, Iterable[str]] | None) -> dict[str, tuple[str, ...]]:
    """``volatile={"tool": ["meta.nonce"]}``: the argument paths each tool's model fills anew,
    checked."""
    if volatile is None:
        return {}
    if not isinstance(volatile, Mapping):
        raise TypeError(f"volatile must map tool names to argument paths, got {volatile!r}")
    out: dict[str, tuple[str, ...]] = {}
    for name, paths in volatile.items():
        if isinstance(paths, str) or not all(isinstance(p, str) for p in paths):
            raise TypeError(f"volatile[{name!r}] must be a list of paths (str), got {paths!r}")
        out[str(name)] = tuple(paths)
    return out


class ToolRules:
    """What an adapter knows about a framework's tools, by name (``side_effects`` and the
    :class:`ToolOptions`, checked); as ``run.call_tool`` options."""

    def __init__(self, side_effects: SideEffects = None, **options: Unpack[ToolOptions]) -> None:
        unknown = set(options) - ToolOptions.__optional_keys__
        if unknown:
            raise TypeError(f"unknown tool option(s): {', '.join(sorted(unknown))}")
        self.side_effects = side_effect_map(side_effects)
        self.labels = _labels(options.get("labels"))
        hand_over = options.get("hand_over")
        if isinstance(hand_over, str) or not all(isinstance(n, str) for n in hand_over or ()):
            raise TypeError(
                f"hand_over must be a list of tool names, e.g. [{hand_over!r}], got {hand_over!r}"
                if isinstance(hand_over, str)
                else f"hand_over must be a list of tool names, got {hand_over!r}"
            )
        #: the tools whose call hands the customer to a person (the run ends "escalated")
        self.hand_over = frozenset(hand_over or ())
        self.timeouts = dict(options.get("timeouts") or {})
        self.requires_approval = dict(options.get("requires_approval") or {})
        self.compensate = dict(options.get("compensate") or {})
        self.volatile = volatile_paths(options.get("volatile"))
        for name, fn in self.compensate.items():
            if not callable(fn):
                raise TypeError(f"compensate[{name!r}] must be callable, got {fn!r}")
        for name, rule in self.requires_approval.items():
            if not isinstance(rule, bool) and not callable(rule):
                raise TypeError(
                    f"requires_approval[{name!r}] must be a bool or a predicate, got {rule!r}"
                )

    def needing_approval(self) -> list[str]:
        """The tools that may need a person's approval."""
        return [name for name, rule in self.requires_approval.items() if rule is not False]

    def options(self, name: str, timeout: float | None = None) -> dict[str, Any]:
        return {
            "timeout": self.timeouts.get(name, timeout),
            "idempotent": name not in self.side_effects,
            "lookup": self.side_effects.get(name),
            "requires_approval": self.requires_approval.get(name, False),
            "compensate": self.compensate.get(name),
            "label": self.labels.get(name),
            "hands_over": name in self.hand_over,
            "volatile": self.volatile.get(name, ()),
        }


class ModelRetries:
    """Tether's retry decisions for a framework that makes a model request's attempts
    itself (the Agents SDK's runner, PydanticAI's ``RetryModelRequest``): the guard's
    classification, its two-tier backoff and ``Retry-After``, its attempts, and never a
    wait past the run's time budget. Each retry is counted in the run's usage."""

    def __init__(self, policy: RetryPolicy, run: Run | None) -> None:
        self.policy = policy
        self.run = run
        self._waits = policy.waits()

    def wait(self, verdict: Any, attempt: int) -> float | None:
        """The wait before the next attempt after attempt ``attempt`` failed with
        ``verdict``; None when there is none (not retryable, no attempts or time left)."""
        if attempt <= 1:
            self._waits = self.policy.waits()  # a new request: fresh tiers
        run = self.run
        if not verdict.retryable or attempt >= self.policy.max_attempts:
            return None
        if run is not None and run.stopped is not None:
            return None
        delay = self._waits.next(verdict)
        left = None if run is None else run.time_left()
        if left is not None and delay >= left:
            return None
        if run is not None:
            run.count_retries()
        _log.info(
            "tether: model call failed (%s); retry %d in %.2f s", verdict.reason, attempt, delay
        )
        return delay


def blocking(start: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``start()`` makes from synchronous code (an adapter's ``run_sync``);
    from inside a running event loop, say to await the async form instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(start())
    raise RuntimeError("run_sync was called from a running event loop: `await run(...)` instead")


def unknown_tool(name: str) -> None:
    """Stands in for a tool the model named but that does not exist."""
    raise LookupError(f"there is no tool named {name!r}")


def malformed_arguments(raw: str) -> None:
    """Stands in for a call whose arguments were not a JSON object."""
    raise ValueError(
        "the tool arguments were not a JSON object; send an object matching the schema"
    )


def result_text(value: Any) -> str:
    """A tool result as the text the model reads, its secrets redacted (structured data
    by field name and pattern, then written as JSON)."""
    from tether.redaction._redact import redact, redact_text

    if isinstance(value, str):
        return redact_text(value)
    try:
        if isinstance(value, Mapping | list | tuple):
            return json.dumps(redact(value), default=str)
        return redact_text(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return redact_text(str(value))


def provider_breaker(provider: str, base_url: str, attempts: int) -> Any:
    """The process's breaker of a model provider at a base URL; its threshold is twice a
    call's attempts, so one call's own retries never open it and two failed calls do
    (a policy with other than five attempts has a breaker of its own, named with it)."""
    base_url = base_url.rstrip("/")
    name = f"{provider}:{base_url}" if base_url else provider
    if attempts != 5:
        name += f"[failure_threshold={2 * attempts}]"
    return breakers.get(name, failure_threshold=2 * attempts)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Endpoint:
    """One SDK method (``messages.create``...), called through the policy and counted."""

    def __init__(self, owner: Guarded, target: Any, read: UsageReader, path: str) -> None:
        self._owner = owner
        self._target = target
        self._read = read
        self._path = path  # "messages.create": the same endpoint on a fallback's client

    def _turn(self, kwargs: dict[str, Any]) -> ModelTurn | None:
        """The request's model turn in the client's run (None: no run); one idempotency key
        for every attempt."""
        headers = dict(kwargs.pop("extra_headers", None) or {})
        headers.setdefault("Idempotency-Key", f"tether-{uuid.uuid4().hex}")
        kwargs["extra_headers"] = headers
        run = self._owner.run
        if run is None:
            return None
        return run.model_turn(
            str(kwargs.get("model") or ""),
            provider=self._owner.provider,
            max_output=_int_or_none(
                kwargs.get(
                    "max_tokens",
                    kwargs.get("max_completion_tokens", kwargs.get("max_output_tokens")),
                )
            ),
        )

    @staticmethod
    def _capped(kwargs: dict[str, Any], turn: ModelTurn | None) -> None:
        """No attempt may outlive the run's time budget (an SDK timeout object is kept)."""
        left = turn.time_left if turn is not None else None
        given = kwargs.get("timeout")
        if left is not None and (given is None or isinstance(given, int | float)):
            kwargs["timeout"] = min(float(given or left), left)

    def __call__(self, **kwargs: Any) -> Any:
        chain = candidates(self._owner, str(kwargs.get("model") or ""))
        if len(chain) == 1:
            return self._one(kwargs)
        if self._owner.is_async:
            return acall_chain(chain, self._asend_to, kwargs)
        return call_chain(chain, self._send_to, kwargs)

    def _on(self, client: Guarded) -> _Endpoint:
        """This endpoint on ``client`` (a fallback's own client; another provider's chat)."""
        if client is self._owner:
            return self
        path = self._path if client.provider == self._owner.provider else client.chat_endpoint
        target = client.raw
        for part in path.split("."):
            target = getattr(target, part)
        namespace, _, method = path.rpartition(".")
        return _Endpoint(client, target, client.namespaces[namespace][method], path)

    def _send_to(self, client: Guarded, kwargs: dict[str, Any], last: bool) -> Any:
        if client.provider == self._owner.provider:
            return self._on(client)._one(kwargs, last)
        way = translation(self._owner.provider, client.provider)
        return way.reply(self._on(client)._one(way.request(kwargs), last))

    async def _asend_to(self, client: Guarded, kwargs: dict[str, Any], last: bool) -> Any:
        if client.provider == self._owner.provider:
            return await self._on(client)._one(kwargs, last)
        way = translation(self._owner.provider, client.provider)
        return way.reply(await self._on(client)._one(way.request(kwargs), last))

    def _one(self, kwargs: dict[str, Any], last: bool = True) -> Any:
        """The request to one model, in one model turn of the run: its checks, its token
        budget's wait, its attempts, its usage. The turn's failure stops the run, unless a
        fallback comes after (``last`` False): then the failure gives way."""
        if self._owner.is_async:
            return self._aone(kwargs, last)
        turn = self._turn(kwargs)
        if turn is None:
            return self._in_turn(None, kwargs, last)
        if last:
            with turn:
                return self._in_turn(turn, kwargs, last)
        turn.open()
        try:
            return self._in_turn(turn, kwargs, last)
        except BaseException as exc:
            turn.gave_way(exc)
            raise

    async def _aone(self, kwargs: dict[str, Any], last: bool) -> Any:
        turn = self._turn(kwargs)
        if turn is None:
            return await self._ain_turn(None, kwargs, last)
        if last:
            async with turn:
                return await self._ain_turn(turn, kwargs, last)
        await turn.aopen()
        try:
            return await self._ain_turn(turn, kwargs, last)
        except BaseException as exc:
            turn.gave_way(exc)
            raise

    def _in_turn(self, turn: ModelTurn | None, kwargs: dict[str, Any], last: bool) -> Any:
        owner = self._owner
        gate = gate_for(
            owner.token_budgets,
            owner.run,
            owner.provider,
            self._target,
            kwargs,
            self._read,
            halts=last,
        )
        if gate is not None:  # the token budget's wait, before the retry loop
            gate.begin()
        self._capped(kwargs, turn)
        if kwargs.get("stream"):

            def open_first() -> tuple[Any, Any, Any]:
                stream = self._send(gate, kwargs)
                events = iter(stream)
                return stream, events, next(events)

            # a stream that breaks before its first event is retried; after that, nothing
            stream, events, first = self._attempts(turn, open_first, last)
            return GuardedStream(stream, events, first, turn, self._read)
        with self._span(kwargs) as span:
            response = self._attempts(turn, lambda: self._send(gate, kwargs), last)
            usage = self._read(response)
            _response_attributes(span, response, usage)
        return self._counted(turn, response, usage)

    async def _ain_turn(self, turn: ModelTurn | None, kwargs: dict[str, Any], last: bool) -> Any:
        owner = self._owner
        gate = gate_for(
            owner.token_budgets,
            owner.run,
            owner.provider,
            self._target,
            kwargs,
            self._read,
            halts=last,
        )
        if gate is not None:
            await gate.abegin()
        self._capped(kwargs, turn)
        if kwargs.get("stream"):

            async def open_first() -> tuple[Any, Any, Any]:
                stream = await self._asend(gate, kwargs)
                events = stream.__aiter__()
                return stream, events, await events.__anext__()

            stream, events, first = await self._aattempts(turn, open_first, last)
            return AsyncGuardedStream(stream, events, first, turn, self._read)
        with self._span(kwargs) as span:
            response = await self._aattempts(turn, lambda: self._asend(gate, kwargs), last)
            usage = self._read(response)
            _response_attributes(span, response, usage)
        return self._counted(turn, response, usage)

    def _span(self, kwargs: dict[str, Any]) -> Any:
        """The request's ``chat`` span (OpenTelemetry's GenAI conventions)."""
        owner = self._owner
        return telemetry.span(
            f"chat {kwargs.get('model', '')}", **_request_attributes(owner, kwargs)
        )

    def _attempts(self, turn: ModelTurn | None, fn: Callable[[], T], last: bool) -> T:
        """``fn()`` under the client's policy within the run's time, its retries counted; an
        open breaker waited out, unless a fallback comes after (it gives way at once)."""
        policy = self._owner.policy
        if turn is None:
            return policy.call_within(None, fn)
        return turn.call(fn, policy=policy, breaker_wait=last)

    async def _aattempts(
        self, turn: ModelTurn | None, fn: Callable[[], Awaitable[T]], last: bool
    ) -> T:
        policy = self._owner.policy
        if turn is None:
            return await policy.acall_within(None, fn)
        return await turn.acall(fn, policy=policy, breaker_wait=last)

    @staticmethod
    def _counted(turn: ModelTurn | None, response: Any, usage: RequestUsage | None) -> Any:
        """The response, its usage counted in the run (a reply without one: unmeasured)."""
        if turn is not None:
            if usage is None:
                turn.record(unmeasured=True)
            else:
                turn.record(usage)
        return response

    def _send(self, gate: TokenGate | None, kwargs: dict[str, Any]) -> Any:
        """One attempt: through the token budget when one covers the model."""
        return self._target(**kwargs) if gate is None else gate.call(self._target, kwargs)

    async def _asend(self, gate: TokenGate | None, kwargs: dict[str, Any]) -> Any:
        return await (self._target(**kwargs) if gate is None else gate.acall(self._target, kwargs))


class _StreamUsage:
    """The usage a stream's events report, read by the endpoint's own reader (the same one
    a reply read whole goes through), merged into one value for the request."""

    def __init__(self, read: UsageReader) -> None:
        self._read = read
        self.usage = RequestUsage()

    def see(self, event: Any) -> None:
        seen = stream_usage(self._read, event)
        if seen is not None:
            self.usage = self.usage.merged(seen)

    def record(self, turn: ModelTurn | None) -> None:
        if turn is not None:
            turn.record(self.usage) if self.usage.counted else turn.record(unmeasured=True)


class _StreamBase:
    def __init__(
        self, stream: Any, events: Any, first: Any, turn: ModelTurn | None, read: UsageReader
    ) -> None:
        self.stream = stream
        self._events = events
        self._first = first
        self._turn = turn.record_later() if turn is not None else None
        self.truncated = False
        self.error: BaseException | None = None
        self._usage = _StreamUsage(read)

    def _seen(self, event: Any) -> Any:
        self._usage.see(event)
        return event

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """While the events after the first are read: a break ends the stream as
        truncated; whatever happens, the usage seen is counted in the run."""
        try:
            yield
        except Exception as exc:
            self.truncated, self.error = True, exc
            _log.warning(
                "tether: stream broke after content arrived (%s); reply marked truncated", exc
            )
        finally:
            self._usage.record(self._turn)


class GuardedStream(_StreamBase):
    """A stream whose first event arrived; a break after that ends it as ``truncated``.

    Iterate it as the SDK's stream. If the connection breaks mid-way the iteration ends,
    ``truncated`` is True and ``error`` holds the cause: a reply that was cut is never
    silently replayed and never mistaken for a whole one.
    """

    def __iter__(self) -> Any:
        yield self._seen(self._first)
        with self._reading():
            for event in self._events:
                yield self._seen(event)

    def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> GuardedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncGuardedStream(_StreamBase):
    """The async form of :class:`GuardedStream`."""

    async def __aiter__(self) -> Any:
        yield self._seen(self._first)
        with self._reading():
            async for event in self._events:
                yield self._seen(event)

    async def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if callable(close):
            await close()


def _request_attributes(owner: Guarded, kwargs: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry GenAI semantic-convention attributes of a request."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": owner.provider,
        "gen_ai.request.model": kwargs.get("model"),
        "gen_ai.request.max_tokens": kwargs.get("max_tokens"),
    }


def _response_attributes(span: Any, response: Any, usage: RequestUsage | None) -> None:
    """The response's span attributes; its usage as the endpoint's converter read it (the
    input: the whole prompt, cached tokens too)."""
    if span is None:
        return
    reasons = (
        [getattr(response, "stop_reason", None)]
        if hasattr(response, "stop_reason")
        else [getattr(c, "finish_reason", None) for c in getattr(response, "choices", None) or []]
    )
    telemetry.set_attributes(
        span,
        **{
            "gen_ai.response.id": getattr(response, "id", None),
            "gen_ai.response.model": getattr(response, "model", None),
            "gen_ai.response.finish_reasons": [r for r in reasons if r],
            "gen_ai.usage.input_tokens": None if usage is None else usage.prompt,
            "gen_ai.usage.output_tokens": None if usage is None else usage.output_tokens,
        },
    )


class _Node:
    """A level of the client (``client.chat``, ``client.chat.completions``) on the way to an endpoint."""

    def __init__(self, owner: Guarded, target: Any, path: str) -> None:
        self._owner = owner
        self._target = target
        self._path = path

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        endpoints = self._owner.namespaces.get(self._path, {})
        if name in endpoints:
            return _Endpoint(self._owner, value, endpoints[name], f"{self._path}.{name}")
        return self._owner._wrap(value, f"{self._path}.{name}")


class Guarded:
    """An SDK client with its own retries off; tether's policy is the only retry layer."""

    provider = ""
    namespaces: ClassVar[dict[str, dict[str, UsageReader]]] = {}
    #: the endpoint an agent loop's turns go to ("messages.create")
    chat_endpoint = ""

    def __init__(
        self,
        client: Any,
        policy: RetryPolicy | None = None,
        run: Run | None = None,
        token_budget: Any = None,
        *,
        fallbacks: Sequence[Fallback | str] | None = None,
    ) -> None:
        #: the provider token budgets of this client's calls (besides its run's guard's)
        self.token_budgets = budgets_for(
            token_budget if token_budget is not None else getattr(client, "token_budgets", None)
        )
        inherited_fallbacks = getattr(client, "fallbacks", None)
        if isinstance(client, Guarded):
            client = client.raw
        self.raw: Any = client.with_options(max_retries=0)
        create = getattr(self._first_endpoint(), "create", None)
        self.is_async = inspect.iscoroutinefunction(inspect.unwrap(create)) if create else False
        self.is_async = self.is_async or any(
            c.__name__.startswith("Async") for c in type(client).__mro__
        )
        self.policy = policy or self._default_policy(client)
        if run is not None and policy is None:
            self.policy = self.policy.replace(clock=run.clock)
        self.run = run
        #: the models a request goes to when its own cannot answer (tether.Fallback)
        self.fallbacks = check_chain(
            self, Fallback.chain(fallbacks if fallbacks is not None else inherited_fallbacks)
        )

    def _default_policy(self, client: Any) -> RetryPolicy:
        """Five attempts, and a breaker per provider and base URL whose threshold is twice
        that: one call's own retries never open it, two calls that failed in a row do."""
        policy = RetryPolicy(name=self.provider)
        base_url = str(getattr(client, "base_url", "") or "")
        return policy.replace(
            breaker=provider_breaker(self.provider, base_url, policy.max_attempts)
        )

    def _first_endpoint(self) -> Any:
        target: Any = self.raw
        for part in next(iter(self.namespaces)).split("."):
            target = getattr(target, part)
        return target

    def bind(self, run: Run | None) -> Guarded:
        """The same client counting usage into ``run``."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.run = run
        if run is not None:
            clone.policy = self.policy.replace(clock=run.clock)
        return clone

    def with_fallbacks(self, fallbacks: Any, request: Mapping[str, Any] | None = None) -> Guarded:
        """The same client with the fallback chain ``fallbacks`` (:class:`tether.Fallback`);
        given an agent loop's first ``request``, a fallback of the other provider too."""
        clone = self.bind(self.run)
        clone.fallbacks = check_chain(self, Fallback.chain(fallbacks), request)
        return clone

    def _wrap(self, value: Any, path: str) -> Any:
        if any(known == path or known.startswith(path + ".") for known in self.namespaces):
            return _Node(self, value, path)
        return value

    def __getattr__(self, name: str) -> Any:
        if name == "raw":  # not set yet: construction failed half-way
            raise AttributeError(name)
        return self._wrap(getattr(self.raw, name), name)
