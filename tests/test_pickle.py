"""Everything tether raises survives pickle: a durable engine (DBOS), a process pool
(multiprocessing) or a task queue (Celery) pickles the exception a step raised and
unpickles it elsewhere. Unpickled, it is the same class with the same message and the same
attributes. The table names an instance of every exception class defined in tether; a new
class with its own ``__init__`` has to be added to it."""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import tether
from tether import Outcome, StopReason, Usage

#: the modules of the extras that ``all`` leaves out (their frameworks pin other versions of
#: packages the rest needs): imported when their framework is installed
_OUTSIDE_ALL = {
    "tether.integrations.adk",
    "tether.integrations.crewai",
    "tether.integrations.litellm",
    "tether.integrations.strands",
}


def _imported(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except tether.MissingExtraError:
        if name in _OUTSIDE_ALL:
            return None
        raise


# every module of the package (the extras of `all` are installed in the test environment)
_MODULES = [
    module
    for m in pkgutil.walk_packages(tether.__path__, "tether.")
    if not m.name.endswith("__main__") and (module := _imported(m.name)) is not None
]


def _classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _MODULES:
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.split(".")[0] == "tether"
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


CLASSES = _classes()


def _outcome() -> Outcome:
    return Outcome(
        status="stopped",
        stopped_because=StopReason.MAX_COST,
        usage=Usage(steps=3, model_calls=2, cost_usd=0.25),
        result=None,
        customer_message="We could not finish your refund; a person will follow up.",
        run_id="run_pickle",
    )


def _letter() -> Any:
    from tether.records._collections import DeadLetter

    return DeadLetter(
        id="dl_1",
        tool="refund",
        args={"order": "A-1", "card": "[REDACTED]"},
        error_type="ValueError",
        error="boom",
        run_id="run_1",
        task="refund A-1",
        at=1.0,
        redacted=("card",),
    )


def _response() -> httpx.Response:
    return httpx.Response(
        503, headers={"Retry-After": "2"}, request=httpx.Request("GET", "https://x.test/a")
    )


#: How to make an instance of each class (whose __init__ takes more than a message)
MAKE: dict[str, Callable[[], BaseException]] = {
    "tether.integrations.langchain.FailedReply": lambda: _class(
        "tether.integrations.langchain.FailedReply"
    )("card expired"),
    "tether._errors.CircuitOpenError": lambda: tether.CircuitOpenError("pay", 1000.0, 990.0),
    "tether._errors.ControlSignal": lambda: _class("tether._errors.ControlSignal")(
        KeyError("interrupt")
    ),
    "tether._errors.Declined": lambda: tether.Declined("the customer said no"),
    "tether._errors.EffectInProgress": lambda: tether.EffectInProgress("k" * 40, 12.5),
    "tether._errors.EffectNotRecorded": lambda: tether.EffectNotRecorded(
        "k" * 40, {"refund": "re_1"}, "the store is down"
    ),
    "tether._errors.LimiterTimeout": lambda: tether.LimiterTimeout("pay", 2.5),
    "tether._errors.MissingExtraError": lambda: tether.MissingExtraError("dbos", "dbos"),
    "tether._errors.UnknownOutcome": lambda: tether.UnknownOutcome("k" * 40, "timed out"),
    "tether.bench._fleet.Overloaded": lambda: _class("tether.bench._fleet.Overloaded")(503),
    "tether.bench._live._Status": lambda: _class("tether.bench._live._Status")(429),
    "tether.bench._worlds.HTTPError": lambda: _class("tether.bench._worlds.HTTPError")(429, 1.5),
    "tether.cli._demo.HTTPStatusError": lambda: _class("tether.cli._demo.HTTPStatusError")(
        502, "bad gateway"
    ),
    "tether.effects._recorder.EffectFailed": lambda: _class(
        "tether.effects._recorder.EffectFailed"
    )("ValueError", "no such order"),
    "tether.effects._wrap.ResponseStatusError": lambda: _class(
        "tether.effects._wrap.ResponseStatusError"
    )(_response()),
    "tether.integrations._agents_hooks.GuardStopped": lambda: _class(
        "tether.integrations._agents_hooks.GuardStopped"
    )(StopReason.MAX_STEPS, "10 steps"),
    "tether.integrations.pydantic_ai.RunStopped": lambda: _class(
        "tether.integrations.pydantic_ai.RunStopped"
    )(_outcome()),
    "tether.records._collections.RedactedArguments": lambda: _class(
        "tether.records._collections.RedactedArguments"
    )(_letter()),
    "tether.run._governance.ApprovalRejected": lambda: _class(
        "tether.run._governance.ApprovalRejected"
    )("refund", "a person rejected it", cause_kind="rejected"),
    "tether.run._governance.PolicyDenied": lambda: _class("tether.run._governance.PolicyDenied")(
        "refund", "over the limit", cause_kind="rejected"
    ),
    "tether.run._health.ToolUnresponsive": lambda: _class("tether.run._health.ToolUnresponsive")(
        "lookup", 2, 1
    ),
    "tether.run._outcome.Stopped": lambda: tether.Stopped(StopReason.MAX_COST, "$1.00 spent"),
    "tether.run._outcome.ToolError": lambda: tether.ToolError("refund", "rejected", cause_kind="x"),
}


def _class(name: str) -> Any:
    return CLASSES[name]


def _takes_a_message(cls: type[BaseException]) -> bool:
    """A class whose __init__ is BaseException's (or takes ``*args``): made with a message."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return True
    return all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def _make(name: str) -> BaseException:
    if name in MAKE:
        return MAKE[name]()
    cls = CLASSES[name]
    assert _takes_a_message(cls), f"{name} takes arguments: add an instance of it to MAKE"
    return cls("something went wrong: order A-1")


def _same(a: Any, b: Any) -> bool:
    """Equal meaning: exceptions by class, args and attributes; responses by status and
    headers; everything else by ==."""
    if isinstance(a, BaseException):
        return (
            type(a) is type(b)
            and a.args == b.args
            and str(a) == str(b)
            and vars(a).keys() == vars(b).keys()
            and all(_same(v, vars(b)[k]) for k, v in vars(a).items())
        )
    if isinstance(a, httpx.Response):
        return (
            isinstance(b, httpx.Response)
            and (a.status_code, a.content) == (b.status_code, b.content)
            and a.headers == b.headers
        )
    return bool(a == b)


def test_the_table_names_every_exception_class() -> None:
    assert len(CLASSES) >= 30, sorted(CLASSES)  # the walk found the package's classes
    assert set(MAKE) <= set(CLASSES), set(MAKE) - set(CLASSES)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_survives_pickle(name: str) -> None:
    exc = _make(name)
    assert type(exc) is CLASSES[name]
    for protocol in (pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL, 2):
        back = pickle.loads(pickle.dumps(exc, protocol=protocol))
        assert _same(exc, back), (vars(exc), vars(back))


def test_stopped_keeps_its_reason() -> None:
    back = pickle.loads(pickle.dumps(tether.Stopped(StopReason.MAX_COST, "$1.00 spent")))
    assert back.reason is StopReason.MAX_COST
    assert back.detail == "$1.00 spent"
    assert str(back) == "max_cost: $1.00 spent"


def test_run_stopped_keeps_the_customer_message() -> None:
    from tether.integrations.pydantic_ai import RunStopped

    back = pickle.loads(pickle.dumps(RunStopped(_outcome())))
    assert isinstance(back.outcome, Outcome)
    assert back.outcome.customer_message.startswith("We could not finish your refund")
    assert back.outcome.usage.cost_usd == 0.25


def test_a_subclass_of_transient_error_with_its_own_arguments() -> None:
    """A user's TransientError subclass inherits the same pickling."""

    back = pickle.loads(pickle.dumps(_RateLimited("pay", 2.0)))
    assert (type(back), back.service, back.wait, str(back)) == (
        _RateLimited,
        "pay",
        2.0,
        "pay: rate limited for 2.0 s",
    )


class _RateLimited(tether.TransientError):
    def __init__(self, service: str, wait: float) -> None:
        self.service, self.wait = service, wait
        super().__init__(f"{service}: rate limited for {wait} s")


def _raise_stopped(detail: str) -> None:
    raise tether.Stopped(StopReason.MAX_STEPS, detail)


def test_a_process_pool_hands_the_stop_back() -> None:
    """multiprocessing pickles what a worker raised: the caller gets the Stopped itself."""
    with (
        multiprocessing.get_context("spawn").Pool(1) as pool,
        pytest.raises(tether.Stopped) as raised,
    ):
        # (an exception that cannot be unpickled never comes back: the wait times out)
        pool.apply_async(_raise_stopped, ("10 steps",)).get(timeout=60)
    assert raised.value.reason is StopReason.MAX_STEPS
    assert raised.value.detail == "10 steps"
