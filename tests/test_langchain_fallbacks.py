"""Fallback models in a LangChain v1 agent: a real ``create_agent`` with LangChain's fake chat
models, under ``TetherMiddleware`` with a chain of ``tether.Fallback``; sync and async."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelFallbackMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from tether import Budget, CircuitBreaker, Fallback, Guard, RetryPolicy, StopReason
from tether.integrations.langchain import TetherMiddleware

USER = {"messages": [("user", "hello")]}


class Model(GenericFakeChatModel):
    """LangChain's fake chat model with a name, counting its calls; ``error``: what each
    call raises instead of answering (as a provider's SDK would)."""

    model_name: str = "gpt-primary"
    error: Any = None
    asked: int = 0

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        if self.error is not None:
            raise self.error
        return super()._generate(*args, **kwargs)


def says(text: str) -> Iterator[AIMessage]:
    return itertools.repeat(
        AIMessage(
            content=text,
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        )
    )


def openai_error(cls: type[openai.APIStatusError], status: int, code: str) -> Exception:
    """The exception the openai SDK raises (and langchain-openai lets through) for a reply."""
    body = {"error": {"message": code, "type": code, "param": None, "code": code}}
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(status, json=body, request=request)
    return cls(code, response=response, body=body["error"])


def open_breaker() -> CircuitBreaker:
    """The primary's breaker, opened by a real failed call."""

    def reset() -> None:
        raise ConnectionError("reset")

    breaker = CircuitBreaker("lc-primary", failure_threshold=1, cooldown=60.0)
    with pytest.raises(ConnectionError):
        breaker.call(reset)
    assert breaker.state == "open"
    return breaker


def invoke(agent: Any, shell: str) -> dict[str, Any]:
    if shell == "async":
        return asyncio.run(agent.ainvoke(USER))  # type: ignore[no-any-return]
    return agent.invoke(USER)  # type: ignore[no-any-return]


@pytest.fixture(params=["sync", "async"])
def shell(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


def test_an_open_breaker_sends_the_call_to_the_fallback(shell: str) -> None:
    """The primary's breaker is open: nothing is asked of it; the fallback answers, and the
    run counts the fallback's call under its name."""
    primary = Model(messages=says("from the primary"))
    backup = Model(model_name="gpt-backup", messages=says("from the backup"))
    guard = Guard(
        retry=RetryPolicy(breaker=open_breaker()), fallbacks=[Fallback("gpt-backup", client=backup)]
    )
    agent = create_agent(primary, middleware=[TetherMiddleware(guard)])
    state = invoke(agent, shell)
    outcome = state["tether_outcome"]
    assert primary.asked == 0
    assert backup.asked == 1
    assert state["messages"][-1].content == "from the backup"
    assert outcome.stopped_because is StopReason.GOAL_REACHED
    assert outcome.models == ("gpt-backup",)
    assert outcome.usage.model_calls == 1


def test_without_a_fallback_the_open_breaker_stops_the_run(shell: str) -> None:
    primary = Model(messages=says("from the primary"))
    guard = Guard(retry=RetryPolicy(breaker=open_breaker()))
    state = invoke(create_agent(primary, middleware=[TetherMiddleware(guard)]), shell)
    assert primary.asked == 0
    assert state["tether_outcome"].stopped_because is StopReason.CIRCUIT_OPEN


def test_a_quota_refusal_sends_the_call_to_the_fallback(shell: str) -> None:
    """OpenAI's insufficient_quota (a 429 no wait cures): asked once, then the fallback."""
    quota = openai_error(openai.RateLimitError, 429, "insufficient_quota")
    primary = Model(messages=says("never"), error=quota)
    backup = Model(model_name="gpt-backup", messages=says("from the backup"))
    middleware = TetherMiddleware(Guard(), fallbacks=[Fallback("gpt-backup", client=backup)])
    state = invoke(create_agent(primary, middleware=[middleware]), shell)
    outcome = state["tether_outcome"]
    assert (primary.asked, backup.asked) == (1, 1)
    assert state["messages"][-1].content == "from the backup"
    assert outcome.stopped_because is StopReason.GOAL_REACHED
    assert outcome.models == ("gpt-backup",)


def test_a_bad_request_is_not_a_reason_to_fall_back(shell: str) -> None:
    """A 400 is wrong for every model: the run stops, the fallback is never asked."""
    bad = openai_error(openai.BadRequestError, 400, "invalid_request_error")
    primary = Model(messages=says("never"), error=bad)
    backup = Model(model_name="gpt-backup", messages=says("from the backup"))
    guard = Guard(fallbacks=[Fallback("gpt-backup", client=backup)])
    state = invoke(create_agent(primary, middleware=[TetherMiddleware(guard)]), shell)
    outcome = state["tether_outcome"]
    assert (primary.asked, backup.asked) == (1, 0)
    assert outcome.stopped_because is StopReason.PERMANENT_ERROR
    assert outcome.models == ()


def test_each_model_is_priced_as_itself(shell: str) -> None:
    """A cost budget with no price for the fallback's chat model: refused when the guard
    (or the middleware, given its own chain) is made, naming the model, not at the first
    quota refusal in the middle of an incident."""
    backup = Model(model_name="no-such-model-priced", messages=says("from the backup"))
    with pytest.raises(ValueError, match=r"fallbacks\[0\] \('no-such-model-priced'\)"):
        Guard(budget=Budget(max_cost_usd=1.0), fallbacks=[Fallback("x", client=backup)])
    guard = Guard(budget=Budget(max_cost_usd=1.0))
    with pytest.raises(ValueError, match="no-such-model-priced"):
        TetherMiddleware(guard, fallbacks=[Fallback("x", client=backup)])
    assert backup.asked == 0


def test_langchains_own_fallback_middleware_inside_ours_still_works(shell: str) -> None:
    """Stacked inside tether's (after it in the list), ModelFallbackMiddleware takes any
    error first; tether's chain is not asked."""
    bad = openai_error(openai.BadRequestError, 400, "invalid_request_error")
    primary = Model(messages=says("never"), error=bad)
    theirs = Model(model_name="gpt-theirs", messages=says("from theirs"))
    ours = Model(model_name="gpt-ours", messages=says("from ours"))
    guard = Guard(fallbacks=[Fallback("gpt-ours", client=ours)])
    middleware = [TetherMiddleware(guard), ModelFallbackMiddleware(theirs)]
    state = invoke(create_agent(primary, middleware=middleware), shell)
    assert state["messages"][-1].content == "from theirs"
    assert (primary.asked, theirs.asked, ours.asked) == (1, 1, 0)


def test_a_fallback_that_cannot_be_a_chat_model_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"fallbacks\[0\]\.client must be a LangChain chat model"):
        TetherMiddleware(
            Guard(), fallbacks=[Fallback("gpt-6.1-terra", client=openai.OpenAI(api_key="k"))]
        )
    with pytest.raises(ValueError, match=r"fallbacks\[0\] \('no-such-thing'\): LangChain cannot"):
        TetherMiddleware(Guard(fallbacks=["no-such-thing"]))
    with pytest.raises(TypeError, match=r"fallbacks\[1\] must be a tether.Fallback"):
        TetherMiddleware(Guard(), fallbacks=[Fallback("a", client=Model(messages=says("x"))), 3])  # type: ignore[list-item]


def test_the_models_that_answered_survive_the_runs_snapshot(shell: str) -> None:
    """The middleware keeps the run in the graph state (``run.snapshot()``, then
    ``guard.restore``) between hooks: the outcome still names the model that answered."""
    primary = Model(messages=says("hi"))
    state = invoke(create_agent(primary, middleware=[TetherMiddleware(Guard())]), shell)
    assert state["tether_outcome"].models == ("gpt-primary",)


def test_a_restored_run_keeps_its_models() -> None:
    guard = Guard()
    run = guard.start(task="t")
    run.record_model_call(model="gpt-4o", input_tokens=1, output_tokens=1)
    again = guard.restore(run.snapshot())
    again.record_model_call(model="gpt-4o-mini", input_tokens=1, output_tokens=1)
    again.succeed("done")
    again.__exit__(None, None, None)
    assert again.outcome.models == ("gpt-4o", "gpt-4o-mini")


def test_a_resumed_run_names_the_models_before_its_checkpoint(tmp_path: Any) -> None:
    """guard.resume: the models that answered before the checkpoint, then after it."""
    from tether.records._collections import Checkpoints

    store = Checkpoints.sqlite(str(tmp_path / "ckpt.db"))
    with Guard(budget=Budget(max_steps=1), checkpoints=store).start(task="t") as run:
        run.proceed()
        run.record_model_call(model="gpt-4o", input_tokens=1, output_tokens=1)
        assert not run.proceed()
    assert run.outcome.checkpoint_id is not None
    with Guard(budget=Budget(max_steps=5), checkpoints=store).resume(
        run.outcome.checkpoint_id
    ) as again:
        again.record_model_call(model="gpt-4o-mini", input_tokens=1, output_tokens=1)
        again.succeed("done")
    assert again.outcome.models == ("gpt-4o", "gpt-4o-mini")
