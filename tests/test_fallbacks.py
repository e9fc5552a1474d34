"""Fallback models: the real anthropic and openai SDKs, guarded, against scripted APIs on
loopback, with the primary's breaker open, a quota or spend-limit refusal, and a token
budget that would admit the primary only after the run's time; sync and async alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

import tether
from scripted_server import Reply, ScriptedServer, Seen
from tether import (
    Budget,
    CircuitBreaker,
    Fallback,
    Guard,
    RetryPolicy,
    StopReason,
    TokenBudget,
    Tool,
    UnknownModelError,
    VirtualClock,
)
from tether.integrations import anthropic as t_anthropic
from tether.integrations import openai as t_openai
from tether.testing import reset

HI = [{"role": "user", "content": "hi"}]

OPENAI_QUOTA = Reply(
    429,
    {
        "error": {
            "message": "You exceeded your current quota, please check your plan and "
            "billing details.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    },
)
ANTHROPIC_SPEND_LIMIT = Reply(
    429,
    {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "Your organization has reached its monthly API usage limit.",
            "details": {"error_code": "enforced_spend_limit_reached"},
        },
    },
)
ANTHROPIC_BILLING = Reply(
    402,
    {
        "type": "error",
        "error": {"type": "billing_error", "message": "Your credit balance is too low."},
    },
)
OPENAI_RATE_LIMIT = Reply(
    429,
    {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}},
    {"retry-after": "2"},
)
ANTHROPIC_RATE_LIMIT = Reply(
    429,
    {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
    {"retry-after": "2"},
)


def claude_reply(model: str, text: str = "ok", usage: tuple[int, int] = (100, 20)) -> Reply:
    return Reply(
        200,
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        },
    )


def gpt_reply(model: str, text: str = "ok", usage: tuple[int, int] = (100, 20)) -> Reply:
    return Reply(
        200,
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": sum(usage),
            },
        },
    )


PROVIDERS: dict[str, dict[str, Any]] = {
    "anthropic": {
        "module": t_anthropic,
        "sync": lambda s: anthropic.Anthropic(api_key="t", base_url=s.url),
        "async": lambda s: anthropic.AsyncAnthropic(api_key="t", base_url=s.url),
        "create": lambda c: c.messages.create,
        "primary": "claude-sonnet-5-5",
        "fallback": "claude-haiku-4-5",
        "reply": claude_reply,
        "quota": ANTHROPIC_SPEND_LIMIT,
        "rate_limit": ANTHROPIC_RATE_LIMIT,
        "text": lambda r: r.content[0].text,
    },
    "openai": {
        "module": t_openai,
        "sync": lambda s: openai.OpenAI(api_key="t", base_url=s.url + "/v1"),
        "async": lambda s: openai.AsyncOpenAI(api_key="t", base_url=s.url + "/v1"),
        "create": lambda c: c.chat.completions.create,
        "primary": "gpt-4o",
        "fallback": "gpt-4o-mini",
        "reply": gpt_reply,
        "quota": OPENAI_QUOTA,
        "rate_limit": OPENAI_RATE_LIMIT,
        "text": lambda r: r.choices[0].message.content,
    },
}


#: a behaviour through both shells (sync, async), or both providers
SHELLS = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
NAMES = pytest.mark.parametrize("name", sorted(PROVIDERS))
CASES = [(name, a) for name in sorted(PROVIDERS) for a in (False, True)]


@pytest.fixture(params=CASES, ids=[f"{n}-{'async' if a else 'sync'}" for n, a in CASES])
def case(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """Both providers, each through both shells."""
    return request.param  # type: ignore[no-any-return]


def open_breaker(clock: VirtualClock) -> CircuitBreaker:
    """The primary's breaker, opened by a real failed call (a connection reset)."""

    def reset() -> None:
        raise ConnectionError("reset")

    breaker = CircuitBreaker("primary", failure_threshold=1, cooldown=60.0, clock=clock)
    with pytest.raises(ConnectionError):
        breaker.call(reset)
    assert breaker.state == "open"
    return breaker


def models_asked(server: ScriptedServer) -> list[str]:
    return [r.body["model"] for r in server.requests]


def answer_by_model(p: dict[str, Any], refuse: dict[str, Reply]) -> Callable[[Seen], Reply]:
    """The provider: a refusal for the models in ``refuse``, an answer naming the model asked."""

    def handler(seen: Seen) -> Reply:
        model = seen.body["model"]
        return refuse.get(model) or p["reply"](model, f"answered by {model}")

    return handler


@pytest.fixture
def second() -> Iterator[ScriptedServer]:
    """Another endpoint of the provider (another account or region)."""
    with ScriptedServer() as s:
        yield s


def drive(
    p: dict[str, Any], asynchronous: bool, use: Callable[..., Any], *servers: ScriptedServer
) -> Any:
    """``use(*raw_clients)`` with one raw client of ``p`` per server (see :func:`across`)."""
    return across(asynchronous, use, *((p, s) for s in servers))


def ask(p: dict[str, Any], client: Any, model: str) -> Any:
    """One messages.create / chat.completions.create (a coroutine for an async client)."""
    return p["create"](client)(model=model, max_tokens=64, messages=HI)


def agent(p: dict[str, Any], asynchronous: bool) -> Any:
    return p["module"].arun_agent if asynchronous else p["module"].run_agent


# --- the guarded clients ----------------------------------------------------------------


def test_a_quota_refusal_falls_back_to_the_next_model(
    server: ScriptedServer, case: tuple[str, bool]
) -> None:
    """The primary's quota 429 is asked once, then the same request goes to the fallback."""
    p, asynchronous = PROVIDERS[case[0]], case[1]
    server.handler = answer_by_model(p, {p["primary"]: p["quota"]})
    policy = RetryPolicy(clock=VirtualClock())
    fallbacks = [Fallback(p["fallback"])]
    reply = drive(
        p,
        asynchronous,
        lambda raw: ask(
            p, p["module"].guarded(raw, policy=policy, fallbacks=fallbacks), p["primary"]
        ),
        server,
    )
    assert p["text"](reply) == f"answered by {p['fallback']}"
    assert models_asked(server) == [p["primary"], p["fallback"]]
    keys = [r.headers["idempotency-key"] for r in server.requests]
    assert len(set(keys)) == 2  # two requests, each its own key


def test_anthropic_billing_error_falls_back(server: ScriptedServer) -> None:
    """Anthropic's 402 billing_error (credit balance too low) is a quota refusal."""
    p = PROVIDERS["anthropic"]
    server.handler = answer_by_model(p, {p["primary"]: ANTHROPIC_BILLING})
    policy = RetryPolicy(clock=VirtualClock())
    reply = drive(
        p,
        False,
        lambda raw: ask(
            p, t_anthropic.guarded(raw, policy=policy, fallbacks=[p["fallback"]]), p["primary"]
        ),
        server,
    )
    assert p["text"](reply) == f"answered by {p['fallback']}"
    assert models_asked(server) == [p["primary"], p["fallback"]]


def test_an_open_breaker_sends_nothing_to_the_primary(
    server: ScriptedServer, second: ScriptedServer, case: tuple[str, bool]
) -> None:
    """The primary's breaker is open: no request reaches it; the fallback's own client
    (another endpoint, its own breaker) answers."""
    p, asynchronous = PROVIDERS[case[0]], case[1]
    clock = VirtualClock()
    breaker = open_breaker(clock)
    second.handler = answer_by_model(p, {})
    policy = RetryPolicy(breaker=breaker, clock=clock)

    def use(raw: Any, other: Any) -> Any:
        fallbacks = [Fallback(p["fallback"], client=other)]
        return ask(p, p["module"].guarded(raw, policy=policy, fallbacks=fallbacks), p["primary"])

    reply = drive(p, asynchronous, use, server, second)
    assert p["text"](reply) == f"answered by {p['fallback']}"
    assert server.requests == []
    assert models_asked(second) == [p["fallback"]]


@SHELLS
def test_a_fallback_on_the_same_client_shares_its_open_breaker(
    server: ScriptedServer, asynchronous: bool
) -> None:
    """The provider's breaker is the client's: a fallback on the same client is refused
    too, and nothing is sent at all."""
    p = PROVIDERS["openai"]
    clock = VirtualClock()
    breaker = open_breaker(clock)
    policy = RetryPolicy(breaker=breaker, clock=clock)
    with pytest.raises(tether.CircuitOpenError):
        drive(
            p,
            asynchronous,
            lambda raw: ask(
                p, t_openai.guarded(raw, policy=policy, fallbacks=[p["fallback"]]), p["primary"]
            ),
            server,
        )
    assert server.requests == []


def test_an_ordinary_rate_limit_is_waited_not_a_fallback(
    server: ScriptedServer, case: tuple[str, bool]
) -> None:
    """A 429 with Retry-After is the retry policy's: waited out on the primary."""
    p, asynchronous = PROVIDERS[case[0]], case[1]
    server.script = [p["rate_limit"], p["reply"](p["primary"], "primary")]
    clock = VirtualClock()
    policy = RetryPolicy(jitter="none", base=0.1, clock=clock)
    reply = drive(
        p,
        asynchronous,
        lambda raw: ask(
            p, p["module"].guarded(raw, policy=policy, fallbacks=[p["fallback"]]), p["primary"]
        ),
        server,
    )
    assert p["text"](reply) == "primary"
    assert models_asked(server) == [p["primary"], p["primary"]]
    assert clock.now() == pytest.approx(2.0)


@NAMES
def test_a_bad_request_is_not_a_fallback(server: ScriptedServer, name: str) -> None:
    """A 400 is the caller's fault: raised after one request, no fallback asked."""
    p = PROVIDERS[name]
    server.default = Reply(
        400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    )
    policy = RetryPolicy(clock=VirtualClock())
    with pytest.raises((anthropic.BadRequestError, openai.BadRequestError)):
        drive(
            p,
            False,
            lambda raw: ask(
                p, p["module"].guarded(raw, policy=policy, fallbacks=[p["fallback"]]), p["primary"]
            ),
            server,
        )
    assert models_asked(server) == [p["primary"]]


def test_the_last_models_failure_is_the_calls(server: ScriptedServer) -> None:
    """Every model refused for quota: the last refusal is raised, each asked once."""
    p = PROVIDERS["openai"]
    server.default = OPENAI_QUOTA
    policy = RetryPolicy(clock=VirtualClock())
    with pytest.raises(openai.RateLimitError):
        drive(
            p,
            False,
            lambda raw: ask(
                p,
                t_openai.guarded(raw, policy=policy, fallbacks=["gpt-4o-mini", "gpt-5.6-luna"]),
                "gpt-4o",
            ),
            server,
        )
    assert models_asked(server) == ["gpt-4o", "gpt-4o-mini", "gpt-5.6-luna"]


# --- in a run: priced, budgeted, named ------------------------------------------------------


def test_run_agent_falls_back_and_the_outcome_names_the_model(
    server: ScriptedServer, case: tuple[str, bool]
) -> None:
    """Guard(fallbacks=...): run_agent's quota-refused turn is answered by the fallback,
    priced at the fallback's price; outcome.models names it."""
    p, asynchronous = PROVIDERS[case[0]], case[1]
    server.handler = answer_by_model(p, {p["primary"]: p["quota"]})
    guard = Guard(
        clock=VirtualClock(),
        budget=Budget(max_cost_usd=1.0),
        fallbacks=[Fallback(p["fallback"])],
    )
    options = {"model": p["primary"], "messages": HI, "guard": guard, "max_tokens": 64}
    outcome = drive(p, asynchronous, lambda raw: agent(p, asynchronous)(raw, **options), server)
    assert (outcome.status, outcome.result) == ("success", f"answered by {p['fallback']}")
    assert outcome.models == (p["fallback"],)
    assert models_asked(server) == [p["primary"], p["fallback"]]
    price = tether.PriceTable().cost(p["fallback"], 100, 20)
    assert outcome.usage.cost_usd == pytest.approx(price)
    assert outcome.usage.model_calls == 1


def test_run_agent_fallbacks_argument_wins_over_the_guards(server: ScriptedServer) -> None:
    """run_agent(fallbacks=...) is this loop's chain; with an open breaker on the primary
    the fallback answers at once, without waiting for the breaker's probe."""
    p = PROVIDERS["anthropic"]
    clock = VirtualClock()
    breaker = open_breaker(clock)
    policy = RetryPolicy(breaker=breaker, clock=clock)
    guard = Guard(clock=clock, budget=Budget(max_seconds=300), fallbacks=["claude-opus-4-1"])

    def use(raw: Any, other: Any) -> Any:
        client = t_anthropic.guarded(raw, policy=policy)
        return t_anthropic.run_agent(
            client,
            model=p["primary"],
            messages=HI,
            guard=guard,
            fallbacks=[Fallback(p["fallback"], client=other)],
        )

    with ScriptedServer() as other:
        other.handler = answer_by_model(p, {})
        outcome = drive(p, False, use, server, other)
        assert models_asked(other) == [p["fallback"]]
    assert outcome.status == "success" and outcome.models == (p["fallback"],)
    assert server.requests == [] and clock.now() == 0.0


def test_without_a_fallback_the_open_breaker_stops_the_run(server: ScriptedServer) -> None:
    """The same open breaker with no chain: the run stops CIRCUIT_OPEN, nothing sent."""
    p = PROVIDERS["openai"]
    clock = VirtualClock()
    breaker = open_breaker(clock)
    policy = RetryPolicy(breaker=breaker, clock=clock)
    outcome = drive(
        p,
        False,
        lambda raw: t_openai.run_agent(
            t_openai.guarded(raw, policy=policy),
            model=p["primary"],
            messages=HI,
            guard=Guard(clock=clock),
        ),
        server,
    )
    assert outcome.stopped_because is StopReason.CIRCUIT_OPEN
    assert outcome.models == () and server.requests == []


def test_a_token_budget_wait_past_the_run_falls_back(
    server: ScriptedServer, case: tuple[str, bool]
) -> None:
    """The primary's family admits the call only in ~60 s, the run has 10 s left: the
    fallback (another family, its own budget) answers; without the chain, TIMEOUT."""
    p, asynchronous = PROVIDERS[case[0]], case[1]
    server.handler = answer_by_model(p, {})
    clock = VirtualClock()

    def budgets() -> list[TokenBudget]:
        slow = TokenBudget(case[0], p["primary"], requests_per_minute=1, clock=clock)
        slow.reserve(estimated_input_tokens=1, max_output_tokens=1)  # the minute's request
        roomy = TokenBudget(case[0], p["fallback"], requests_per_minute=600, clock=clock)
        return [slow, roomy]

    def run(fallbacks: list[str]) -> tether.Outcome:
        guard = Guard(
            clock=clock, budget=Budget(max_seconds=10), token_budget=budgets(), fallbacks=fallbacks
        )
        options = {"model": p["primary"], "messages": HI, "guard": guard, "max_tokens": 64}
        return drive(p, asynchronous, lambda raw: agent(p, asynchronous)(raw, **options), server)  # type: ignore[no-any-return]

    outcome = run([p["fallback"]])
    assert outcome.status == "success" and outcome.models == (p["fallback"],)
    assert models_asked(server) == [p["fallback"]]
    reset()
    server.requests.clear()
    stopped = run([])
    assert stopped.stopped_because is StopReason.TIMEOUT and server.requests == []


@SHELLS
def test_spans_name_the_model_that_answered(
    server: ScriptedServer, otel: tuple[Any, Any], asynchronous: bool
) -> None:
    """One chat span per model asked, and a tether.fallback event saying why."""
    exporter, _ = otel
    p = PROVIDERS["openai"]
    server.handler = answer_by_model(p, {p["primary"]: p["quota"]})
    policy = RetryPolicy(clock=VirtualClock())
    with Guard(clock=VirtualClock()).start(task="t") as run:
        run.proceed()
        drive(
            p,
            asynchronous,
            lambda raw: ask(
                p,
                t_openai.guarded(raw, policy=policy, run=run, fallbacks=[p["fallback"]]),
                p["primary"],
            ),
            server,
        )
        run.succeed()
    spans = exporter.get_finished_spans()
    chats = [s.name for s in spans if s.name.startswith("chat ")]
    assert chats == [f"chat {p['primary']}", f"chat {p['fallback']}"]
    events = [e for s in spans for e in s.events if e.name == "tether.fallback"]
    assert [e.attributes["tether.fallback.model"] for e in events] == [p["fallback"]]
    assert "quota" in str(events[0].attributes["tether.reason"])


def test_a_guarded_clients_run_uses_the_guards_chain(server: ScriptedServer) -> None:
    """A guarded client with no chain of its own, bound to a run: the guard's chain (its
    entries of the client's provider) applies."""
    p = PROVIDERS["anthropic"]
    server.handler = answer_by_model(p, {p["primary"]: p["quota"]})
    guard = Guard(
        clock=VirtualClock(),
        fallbacks=[Fallback("gpt-4o-mini", provider="openai"), Fallback(p["fallback"])],
    )
    with guard.start(task="t") as run:
        run.proceed()
        reply = drive(
            p, False, lambda raw: ask(p, t_anthropic.guarded(raw, run=run), p["primary"]), server
        )
        run.succeed()
    assert p["text"](reply) == f"answered by {p['fallback']}"
    assert models_asked(server) == [p["primary"], p["fallback"]]
    assert run.outcome.usage.model_calls == 1
    assert run.outcome.models == (p["fallback"],)


def test_outcome_models_in_a_loop_of_your_own() -> None:
    """outcome.models: each model that answered, once, in the order it first did."""
    with Guard(clock=VirtualClock()).start(task="t") as run:
        run.proceed()
        for model in ("claude-sonnet-5-5", "claude-haiku-4-5", "claude-sonnet-5-5"):
            run.record_model_call(input_tokens=10, output_tokens=5, model=model)
        run.succeed()
    assert run.outcome.models == ("claude-sonnet-5-5", "claude-haiku-4-5")
    with Guard(clock=VirtualClock()).start(task="t") as quiet:
        quiet.succeed()
    assert quiet.outcome.models == ()


# --- refused at construction ----------------------------------------------------------------


def test_bad_fallbacks_are_refused_naming_the_field(server: ScriptedServer) -> None:
    with pytest.raises(ValueError, match=r"Fallback\.model"):
        Fallback("")
    with pytest.raises(ValueError, match=r"Fallback\.provider"):
        Fallback("m", provider="azure")
    with pytest.raises(TypeError, match=r"Fallback\.client"):
        Fallback("m", client=object())
    with pytest.raises(TypeError, match=r"fallbacks\[1\]"):
        Guard(fallbacks=["gpt-4o-mini", 3])  # type: ignore[list-item]
    with (
        openai.OpenAI(api_key="t", base_url=server.url) as raw,
        anthropic.Anthropic(api_key="t", base_url=server.url) as other,
    ):
        with pytest.raises(ValueError, match=r"fallbacks\[0\] \('claude-haiku-4-5'\) is a"):
            t_openai.guarded(raw, fallbacks=[Fallback("claude-haiku-4-5", provider="anthropic")])
        with pytest.raises(ValueError, match=r"fallbacks\[0\]"):
            t_openai.guarded(raw, fallbacks=[Fallback("claude-haiku-4-5", client=other)])
        with pytest.raises(ValueError, match="max_tokens"):
            t_anthropic.run_agent(other, model="claude-haiku-4-5", messages=HI, max_tokens=None)
    assert server.requests == []


def test_an_unpriced_fallback_under_a_cost_budget_is_refused_when_the_guard_is_made() -> None:
    """Guard(budget=max_cost_usd, fallbacks=[an unpriced model]) is refused at once, naming
    the model; without a cost budget, or with unknown="zero", it is accepted."""
    with pytest.raises(ValueError, match=r"fallbacks\[1\] \('no-such-model-x'\).*no price"):
        Guard(budget=Budget(max_cost_usd=1.0), fallbacks=["gpt-4o-mini", "no-such-model-x"])
    assert Guard(fallbacks=["no-such-model-x"]).fallbacks == (Fallback("no-such-model-x"),)
    free = tether.PriceTable(unknown="zero")
    Guard(budget=Budget(max_cost_usd=1.0), fallbacks=["no-such-model-x"], prices=free)


def test_a_guarded_clients_unpriced_fallback_is_refused_before_any_request(
    server: ScriptedServer,
) -> None:
    """A guarded client's own chain, bound to a run with a cost budget: its unpriced model is
    refused before the first request, not when a quota refusal sends the call to it."""
    p = PROVIDERS["openai"]
    server.handler = answer_by_model(p, {p["primary"]: p["quota"]})
    guard = Guard(clock=VirtualClock(), budget=Budget(max_cost_usd=1.0))
    with p["sync"](server) as raw, guard.start(task="t") as run:
        run.proceed()
        client = t_openai.guarded(raw, run=run, fallbacks=["no-such-model-x"])
        with pytest.raises(UnknownModelError, match="no-such-model-x"):
            ask(p, client, p["primary"])
    assert server.requests == []


def test_the_shells_keep_their_signatures() -> None:
    """run_agent and arun_agent show their options (one definition, both providers)."""
    import inspect

    for module in (t_anthropic, t_openai):
        for shell in (module.run_agent, module.arun_agent):
            params = inspect.signature(shell).parameters
            assert list(params)[:3] == ["client", "model", "messages"]
            assert params["fallbacks"].default is None and params["max_tokens"].default == 1024
            assert shell.__module__ == module.__name__ and shell.__doc__
        assert inspect.iscoroutinefunction(module.arun_agent)


# --- another provider, in run_agent (tether builds the requests, and translates them) -----


def search(q: str) -> dict[str, str]:
    return {"invoice": q, "status": "paid"}


SEARCH = Tool("search", search, description="find an invoice")


def gpt_agent(seen: Seen) -> Reply:
    """An OpenAI model that searches once, then answers."""
    model = seen.body["model"]
    if not any(m.get("role") == "tool" for m in seen.body["messages"]):
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "search", "arguments": '{"q": "invoice 99"}'},
        }
        return Reply(
            200,
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    }
                ],
                "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
            },
        )
    return gpt_reply(model, "invoice 99 is paid")


def claude_agent(seen: Seen) -> Reply:
    """An Anthropic model that searches once, then answers."""
    model = seen.body["model"]
    blocks = [
        b for m in seen.body["messages"] if isinstance(m["content"], list) for b in m["content"]
    ]
    if not any(b["type"] == "tool_result" for b in blocks):
        use = {"type": "tool_use", "id": "tu_1", "name": "search", "input": {"q": "invoice 99"}}
        return Reply(
            200,
            {
                "id": "m1",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [use],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 50, "output_tokens": 10},
            },
        )
    return claude_reply(model, "invoice 99 is paid")


@SHELLS
def test_an_anthropic_loop_falls_back_to_an_openai_model(
    server: ScriptedServer, second: ScriptedServer, asynchronous: bool
) -> None:
    """Anthropic's spend limit: each turn goes to the OpenAI model in OpenAI's format (tool
    calls and results translated); the conversation stays in Anthropic's."""
    server.default = ANTHROPIC_SPEND_LIMIT
    second.handler = gpt_agent
    clock = VirtualClock()
    p, gpt = PROVIDERS["anthropic"], PROVIDERS["openai"]

    def use(raw: Any, other: Any) -> Any:
        return agent(p, asynchronous)(
            t_anthropic.guarded(raw, policy=RetryPolicy(clock=clock)),
            model="claude-sonnet-5-5",
            messages=[{"role": "user", "content": "invoice 99?"}],
            tools=[SEARCH],
            system="be brief",
            max_tokens=64,
            guard=Guard(clock=clock),
            fallbacks=[Fallback("gpt-4o-mini", client=other)],
            stop_sequences=["END"],
        )

    outcome = across(asynchronous, use, (p, server), (gpt, second))
    assert (outcome.status, outcome.result) == ("success", "invoice 99 is paid")
    assert outcome.models == ("gpt-4o-mini",)
    assert models_asked(server) == ["claude-sonnet-5-5"] * 2  # each turn asks it first
    first, then = (r.body for r in second.requests)
    assert first["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "invoice 99?"},
    ]
    assert first["tools"][0]["function"]["name"] == "search"
    assert (first["max_completion_tokens"], first["stop"]) == (64, ["END"])
    assert then["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"q": "invoice 99"}'
    assert then["messages"][3]["role"] == "tool" and "paid" in then["messages"][3]["content"]
    used, result = outcome.messages[1]["content"][0], outcome.messages[2]["content"][0]
    assert (used["type"], used["input"]) == ("tool_use", {"q": "invoice 99"})
    assert (result["type"], result["tool_use_id"]) == ("tool_result", used["id"])
    price = tether.PriceTable().cost("gpt-4o-mini", 50, 10) + tether.PriceTable().cost(
        "gpt-4o-mini", 100, 20
    )
    assert outcome.usage.cost_usd == pytest.approx(price)


def across(asynchronous: bool, use: Any, *ends: tuple[dict[str, Any], ScriptedServer]) -> Any:
    """``use(*raw_clients)``: one client per (provider, server), of each provider's SDK,
    sync or async (awaited), every client closed after."""
    if not asynchronous:
        with contextlib.ExitStack() as stack:
            return use(*(stack.enter_context(p["sync"](s)) for p, s in ends))

    async def main() -> Any:
        async with contextlib.AsyncExitStack() as stack:
            return await use(*[await stack.enter_async_context(p["async"](s)) for p, s in ends])

    return asyncio.run(main())


@SHELLS
def test_an_openai_loop_falls_back_to_an_anthropic_model(
    server: ScriptedServer, second: ScriptedServer, asynchronous: bool
) -> None:
    """OpenAI's breaker is open: nothing goes to it; the Anthropic model is asked in its
    own format (system prompt, tool_use / tool_result blocks); the conversation stays
    OpenAI's."""
    second.handler = claude_agent
    clock = VirtualClock()
    p, claude = PROVIDERS["openai"], PROVIDERS["anthropic"]
    policy = RetryPolicy(breaker=open_breaker(clock), clock=clock)

    def use(raw: Any, other: Any) -> Any:
        return agent(p, asynchronous)(
            t_openai.guarded(raw, policy=policy),
            model="gpt-4o",
            messages=[{"role": "user", "content": "invoice 99?"}],
            tools=[SEARCH],
            system="be brief",
            max_tokens=64,
            guard=Guard(clock=clock, fallbacks=[Fallback("claude-haiku-4-5", client=other)]),
        )

    outcome = across(asynchronous, use, (p, server), (claude, second))
    assert (outcome.status, outcome.result) == ("success", "invoice 99 is paid")
    assert outcome.models == ("claude-haiku-4-5",) and server.requests == []
    first, then = (r.body for r in second.requests)
    assert (first["system"], first["max_tokens"]) == ("be brief", 64)
    assert first["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "invoice 99?"}]}
    ]
    assert first["tools"][0]["input_schema"]["properties"]["q"]
    assert then["messages"][1]["content"][0] == {
        "type": "tool_use",
        "id": "tu_1",
        "name": "search",
        "input": {"q": "invoice 99"},
    }
    assert then["messages"][2]["content"][0]["tool_use_id"] == "tu_1"
    assert [m["role"] for m in outcome.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


def test_another_providers_fallback_is_refused_before_any_request(
    server: ScriptedServer, second: ScriptedServer
) -> None:
    """No client, an option with no counterpart, or the other shell: refused, naming the
    entry, before any request."""
    p = PROVIDERS["anthropic"]
    guard = Guard(clock=VirtualClock())
    image = [{"role": "user", "content": [{"type": "image", "source": {}}]}]
    refusals = [  # (what the call adds, what the error names)
        (
            {"fallbacks": [Fallback("gpt-4o-mini", provider="openai")]},
            r"fallbacks\[0\] \('gpt-4o-mini'\) is a openai model: give it",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"messages": image}, "image"),
    ]
    with p["sync"](server) as raw, openai.OpenAI(api_key="t", base_url=second.url) as other:
        for change, names in refusals:
            options = {
                "model": "claude-sonnet-5-5",
                "messages": HI,
                "guard": guard,
                "fallbacks": [Fallback("gpt-4o-mini", client=other)],
                **change,
            }
            with pytest.raises(ValueError, match=names):
                t_anthropic.run_agent(raw, **options)

    async def main() -> None:
        async with p["async"](server) as raw:
            with (
                openai.OpenAI(api_key="t", base_url=second.url) as sync_other,
                pytest.raises(ValueError, match=r"fallbacks\[0\]\.client must be an async"),
            ):
                await t_anthropic.arun_agent(
                    raw,
                    model="claude-sonnet-5-5",
                    messages=HI,
                    guard=guard,
                    fallbacks=[Fallback("gpt-4o-mini", client=sync_other)],
                )

    asyncio.run(main())
    assert server.requests == [] and second.requests == []
