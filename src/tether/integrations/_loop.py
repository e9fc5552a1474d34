"""The tool-use loop of ``run_agent``/``arun_agent``: one set of decisions, two thin shells.

A provider's :class:`Turns` builds each request, reads each reply (an answer, a cut
reply, a refusal, tool calls) and writes tool results back in the provider's own message
format; :func:`run_loop` and :func:`arun_loop` drive it with sync and async calls. The
conversation lives in ``run.messages``, so the outcome carries it.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec

from tether import (
    Fallback,
    Guard,
    Outcome,
    Run,
    Stopped,
    StopReason,
    Tool,
    ToolError,
    UnknownModelError,
)
from tether.classification._classify import programming_error
from tether.integrations._common import (
    Guarded,
    malformed_arguments,
    require_a_place_to_wait,
    require_sync_tools,
    result_text,
    unknown_tool,
)

__all__ = [
    "AgentCall",
    "Provider",
    "ToolUse",
    "Turns",
    "acall_model",
    "agent_call",
    "agent_shells",
    "arun_loop",
    "call_model",
    "run_loop",
    "task_of",
]

P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class AgentCall:
    """The options of one ``run_agent`` / ``arun_agent`` call, checked."""

    #: the SDK client (or guarded client) the loop calls
    client: Any
    model: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[Tool, ...]
    guard: Guard
    max_tokens: int | None
    system: str | None
    task: str
    continue_on_max_tokens: bool
    resume: str | None
    key: str | None
    #: the budget scopes the run spends in (``guard.start(scopes=...)``)
    scopes: Sequence[str] | None
    #: the chain given to this call (None: the client's own, else the guard's)
    fallbacks: tuple[Fallback, ...] | None
    create_kwargs: dict[str, Any]


def agent_call(
    client: Any,
    *,
    model: str,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Tool] = (),
    guard: Guard | None = None,
    max_tokens: int | None = 1024,
    system: str | None = None,
    task: str = "",
    continue_on_max_tokens: bool = True,
    resume: str | None = None,
    key: str | None = None,
    fallbacks: Sequence[Fallback | str] | None = None,
    scopes: Sequence[str] | None = None,
    **create_kwargs: Any,
) -> AgentCall:
    """The keyword arguments of ``run_agent`` and ``arun_agent`` (both providers)."""
    guard = guard or Guard()
    return AgentCall(
        client,
        model,
        tuple(dict(m) for m in messages),
        tuple(tools),
        guard,
        max_tokens,
        system,
        task,
        continue_on_max_tokens,
        resume,
        key,
        scopes,
        None if fallbacks is None else Fallback.chain(fallbacks),
        create_kwargs,
    )


@dataclass(frozen=True, slots=True)
class Provider:
    """What the agent loop needs of one provider."""

    #: the guarded client of a raw SDK client (``guarded(client)``)
    guarded: Callable[[Any], Guarded]
    #: the conversation's turns for a call
    turns: Callable[[AgentCall], Turns]
    #: the async SDK client ``arun_agent`` needs, named in its error
    async_client: str

    def client(self, client: Any, call: AgentCall, turns: Turns) -> Guarded:
        """The guarded client of the loop with its fallback chain: the call's, else the
        client's own, else the guard's (checked against the loop's first request: a model
        of the other provider is asked in its own format)."""
        guarded = client if isinstance(client, Guarded) else self.guarded(client)
        chain = call.fallbacks
        if chain is None:
            chain = guarded.fallbacks or call.guard.fallbacks
        return guarded.with_fallbacks(chain, turns.request()) if chain else guarded


def chat(client: Guarded) -> Callable[..., Any]:
    """The endpoint an agent loop's turns go to (``client.messages.create``)."""
    target: Any = client
    for part in client.chat_endpoint.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def agent_shells(
    provider: Provider, options: Callable[P, AgentCall], module: str, docs: tuple[str, str]
) -> tuple[
    Callable[P, Outcome],
    Callable[P, Coroutine[Any, Any, Outcome]],
]:
    """A provider's ``run_agent`` and ``arun_agent``: one set of options (``options``'s
    signature), one loop, two shells."""

    def run_agent(*args: P.args, **kwargs: P.kwargs) -> Outcome:
        call = options(*args, **kwargs)
        client = call.client
        require_sync_tools(call.tools)
        turns = provider.turns(call)
        task = task_of(turns.history, call.task)
        with open_run(call.guard, call.resume, task, call.key, call.tools, call.scopes) as run:
            run_loop(run, turns, chat(provider.client(client, call, turns).bind(run)))
        return run.outcome

    async def arun_agent(*args: P.args, **kwargs: P.kwargs) -> Outcome:
        call = options(*args, **kwargs)
        client = call.client
        turns = provider.turns(call)
        guarded = client if isinstance(client, Guarded) else provider.guarded(client)
        if not guarded.is_async:
            raise TypeError(
                f"arun_agent needs an async client ({provider.async_client}); use run_agent"
            )
        guarded = provider.client(guarded, call, turns)
        task = task_of(turns.history, call.task)
        async with open_run(
            call.guard, call.resume, task, call.key, call.tools, call.scopes
        ) as run:
            await arun_loop(run, turns, chat(guarded.bind(run)))
        return run.outcome

    signature = inspect.signature(options).replace(return_annotation="Outcome")
    for shell, doc in zip((run_agent, arun_agent), docs, strict=True):
        shell.__module__, shell.__doc__ = module, doc
        shell.__signature__ = signature  # type: ignore[attr-defined]
    return run_agent, arun_agent


@dataclass(frozen=True, slots=True)
class ToolUse:
    """One tool call the model asked for; ``args`` is None when they were not an object."""

    id: str
    name: str
    args: dict[str, Any] | None
    raw: str


class Turns(abc.ABC):
    """One provider's side of the loop."""

    def __init__(
        self,
        tools: Sequence[Tool],
        history: list[Any],
        params: dict[str, Any],
        limit_name: str,
        limit: int | None,
        continue_on_max_tokens: bool,
    ) -> None:
        self.tools = {t.name: t for t in tools}
        self.history = history
        self.params = params
        self.limit_name = limit_name
        self.limit = limit
        self.extend = continue_on_max_tokens
        self.extended = False

    def request(self) -> dict[str, Any]:
        """The keyword arguments of the next model call."""
        kwargs = {**self.params, "messages": self.history}
        if self.limit is not None:
            kwargs[self.limit_name] = self.limit
        return kwargs

    def cut(self, run: Run) -> bool:
        """A reply cut at the token limit: True to ask once more with twice the limit;
        otherwise the run stops TRUNCATED."""
        if self.extend and not self.extended and self.limit is not None:
            self.extended, self.limit = True, self.limit * 2
            return True
        run.stop(StopReason.TRUNCATED, f"the reply was cut at the token limit ({self.limit})")
        return False  # pragma: no cover - run.stop raises

    @abc.abstractmethod
    def read(self, run: Run, reply: Any) -> list[ToolUse] | None:
        """Record the reply; the tool calls to run, [] when it is the answer (the run
        succeeded), None to ask again at once."""

    @abc.abstractmethod
    def answer(self, results: list[tuple[ToolUse, str, bool]]) -> None:
        """Write the tool results (use, text, is_error) into the conversation."""

    def pending(self) -> list[ToolUse]:
        """The tool calls of the conversation's last reply that have no results yet (a
        resumed run runs them before asking the model again)."""
        return []


def open_run(
    guard: Guard,
    resume: str | None,
    task: str,
    key: str | None = None,
    tools: Sequence[Tool] = (),
    scopes: Sequence[str] | None = None,
) -> Run:
    """The run of an agent loop: a new one (serving request ``key``), or the checkpointed
    one it continues; refused before any request when a tool may need an approval the guard
    has nowhere to wait for."""
    require_a_place_to_wait(guard, (t.name for t in tools if t.requires_approval is not False))
    return guard.resume(resume) if resume else guard.start(task=task, key=key, scopes=scopes)


def task_of(history: list[Any], task: str = "") -> str:
    """The run's task: the caller's, or the first user message that is text."""
    if task:
        return task
    for m in history:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return str(m["content"])[:200]
    return ""


def _prepare(
    run: Run, turns: Turns, use: ToolUse
) -> tuple[str, Callable[..., Any], dict[str, Any], Tool | None]:
    tool = turns.tools.get(use.name)
    if tool is None:
        return use.name, unknown_tool, {"name": use.name}, None
    if use.args is None:
        return tool.name, malformed_arguments, {"raw": use.raw[:500]}, None
    return tool.name, tool.fn, use.args, tool


def _tool_kwargs(tool: Tool | None) -> dict[str, Any]:
    if tool is None:
        return {}
    return {
        "timeout": tool.timeout,
        "idempotent": tool.idempotent,
        "lookup": tool.lookup,
        "requires_approval": tool.requires_approval,
        "compensate": tool.compensate,
        "volatile": tool.volatile,
        "label": tool.label or None,
        "hands_over": tool.hands_over,
        "reference": tool.reference,
    }


def run_tool(run: Run, turns: Turns, use: ToolUse) -> tuple[ToolUse, str, bool]:
    name, fn, args, tool = _prepare(run, turns, use)
    try:
        return use, result_text(run.call_tool(name, fn, args, **_tool_kwargs(tool))), False
    except ToolError as exc:
        return use, exc.model_message, True


async def arun_tool(run: Run, turns: Turns, use: ToolUse) -> tuple[ToolUse, str, bool]:
    name, fn, args, tool = _prepare(run, turns, use)
    try:
        return use, result_text(await run.acall_tool(name, fn, args, **_tool_kwargs(tool))), False
    except ToolError as exc:
        return use, exc.model_message, True


def _model_failed(run: Run, exc: Exception) -> None:
    """End the run for a model call that failed after its retries (raises Stopped); the
    model turn of the guarded client stopped it already, unless a fallback chain's
    candidate raised a failure that was not its to give way."""
    if isinstance(exc, Stopped | UnknownModelError):
        raise exc
    if programming_error(exc):  # a bug (a bad call...): raised as it is, the run filed
        run.model_call_failed(exc)
        raise exc
    raise run.model_call_failed(exc) from exc


def call_model(run: Run, create: Callable[..., Any], **kwargs: Any) -> Any:
    """One model call of an agent loop: ``create`` is the run's guarded client, whose model
    turn waits out an open breaker and retries within the run's time; a failure after that
    ends the run with its reason."""
    try:
        return create(**kwargs)
    except Exception as exc:
        _model_failed(run, exc)


async def acall_model(run: Run, create: Callable[..., Awaitable[Any]], **kwargs: Any) -> Any:
    """The async form of :func:`call_model`."""
    try:
        return await create(**kwargs)
    except Exception as exc:
        _model_failed(run, exc)


def run_loop(run: Run, turns: Turns, create: Callable[..., Any]) -> None:
    """The sync shell: ask, read, run the tools, answer, until a guard or the answer ends it."""
    run.messages = turns.history
    pending = turns.pending()
    if pending:
        turns.answer([run_tool(run, turns, use) for use in pending])
    while run.proceed():
        uses = turns.read(run, call_model(run, create, **turns.request()))
        if uses:
            turns.answer([run_tool(run, turns, use) for use in uses])
        elif uses is not None:
            break


async def arun_loop(run: Run, turns: Turns, create: Callable[..., Awaitable[Any]]) -> None:
    """The async shell of :func:`run_loop`: async tools awaited, sync tools in a thread."""
    run.messages = turns.history
    pending = turns.pending()
    if pending:
        turns.answer([await arun_tool(run, turns, use) for use in pending])
    while run.proceed():
        uses = turns.read(run, await acall_model(run, create, **turns.request()))
        if uses:
            turns.answer([await arun_tool(run, turns, use) for use in uses])
        elif uses is not None:
            break
