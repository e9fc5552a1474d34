"""Today's model names: none the project uses is deprecated by its provider, a retired one
is a clear error, and a dependency's warning raised as an error is not tether's verdict."""

from __future__ import annotations

import asyncio
import re
import subprocess
import warnings
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic_ai import Agent, DeprecatedModelWarning
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

import tether
from scripted_server import Reply, ScriptedServer
from tether import Guard, StopReason
from tether.integrations import openai as t_openai
from tether.integrations import pydantic_ai as ta_pydantic

ROOT = Path(__file__).resolve().parent.parent
RETIRED = "gpt-5-mini"  # retired by OpenAI on 2026-12-11: the tests below use it on purpose
NAME = re.compile(r"\b(?:claude|gpt|o[134]|chatgpt)-[a-z0-9][a-z0-9.\-]*[a-z0-9]")


def _names_in_the_project() -> dict[str, set[str]]:
    """Every provider model name written in src/, docs/, the README and the tests: name -> files."""
    listed = subprocess.run(
        ["git", "ls-files", "src", "docs", "tests", "README.md"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    names: dict[str, set[str]] = {}
    for path in listed:
        if path.endswith(("test_model_names.py", ".png", ".svg")):
            continue
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        for name in NAME.findall(text):
            names.setdefault(name, set()).add(path)
    return names


def _deprecation(name: str) -> Any:
    """The provider's deprecation notice for ``name`` as PydanticAI's provider profiles ship it."""
    provider = AnthropicProvider if name.startswith("claude") else OpenAIProvider
    profile = provider.model_profile(name) or {}
    return profile.get("deprecation")


def test_the_scan_finds_the_names_it_must_judge() -> None:
    """The scan sees the defaults users meet (so the check below cannot pass by reading nothing)."""
    names = _names_in_the_project()
    assert "src/tether/integrations/openai.py" in names.get("gpt-6.1-terra", set())
    assert _deprecation(RETIRED) is not None  # the check knows a deprecated name when it sees one


def test_no_model_name_the_project_uses_is_deprecated() -> None:
    """Every model name in src/, docs/, the README and the tests is one its provider serves
    without a deprecation notice (the installed PydanticAI's tables); a failure names the
    replacement the provider recommends."""
    found = []
    for name, files in sorted(_names_in_the_project().items()):
        notice = _deprecation(name)
        if notice is not None:
            found.append(
                f"{name} (retires {notice.retirement_date}; use {notice.replacement!r}) "
                f"in {', '.join(sorted(files))}"
            )
    assert found == [], "deprecated model names:\n" + "\n".join(found)


def test_every_default_model_is_priced() -> None:
    """The names tether ships as defaults have a price, in genai-prices and in tether's own table."""
    for source in ("auto", "tether"):  # auto: genai-prices, installed here
        table = tether.PriceTable(source=source, unknown="error")
        for name in ("gpt-6.1-terra", "claude-haiku-4-5", "claude-sonnet-5-5"):
            assert table.cost(name, 1_000_000, 0) > 0, (source, name)


def _not_found(model: str) -> Reply:
    return Reply(404, {"error": {"message": f"The model `{model}` does not exist or you do not "
                                            "have access to it.", "type": "invalid_request_error",
                                 "code": "model_not_found"}})  # fmt: skip


def test_a_retired_model_name_is_a_clear_error_never_a_success(server: ScriptedServer) -> None:
    """The provider refuses a retired name (404 model_not_found): the run fails at once with
    the provider's words, after one request."""
    server.default = _not_found(RETIRED)
    with openai.OpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0) as raw:
        out = t_openai.run_agent(raw, model=RETIRED, messages=[{"role": "user", "content": "hi"}],
                                 guard=Guard())  # fmt: skip
    assert (out.status, out.stopped_because) == ("failed", StopReason.PERMANENT_ERROR)
    assert out.error is not None and RETIRED in out.error
    assert len(server.requests) == 1


def test_a_retired_model_name_is_a_clear_error_async(server: ScriptedServer) -> None:
    """The same through the async shell."""
    server.default = _not_found(RETIRED)

    async def main() -> tether.Outcome:
        async with openai.AsyncOpenAI(api_key="test", base_url=server.url + "/v1",
                                      max_retries=0) as raw:  # fmt: skip
            return await t_openai.arun_agent(raw, model=RETIRED, guard=Guard(),
                                             messages=[{"role": "user", "content": "hi"}])  # fmt: skip

    out = asyncio.run(main())
    assert (out.status, out.stopped_because) == ("failed", StopReason.PERMANENT_ERROR)
    assert len(server.requests) == 1


def test_a_deprecation_warning_raised_as_an_error_is_raised_not_judged(
    server: ScriptedServer,
) -> None:
    """Under ``-W error`` PydanticAI's DeprecatedModelWarning comes out of the run as it is (the
    process chose to make warnings errors); the run is filed ERROR, not PERMANENT_ERROR, and no
    request was sent."""
    guard = Guard()

    async def main() -> None:
        client = openai.AsyncOpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0)
        try:
            model = OpenAIChatModel(RETIRED, provider=OpenAIProvider(openai_client=client))
            await ta_pydantic.run(Agent(model), "find invoice 99", guard=guard)
        finally:
            await client.close()

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedModelWarning)
        with pytest.raises(DeprecatedModelWarning, match=r"gpt-6\.1-terra"):
            asyncio.run(main())
    assert server.requests == []


def test_a_warning_raised_as_an_error_by_the_client_is_raised_unchanged(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_agent: a client that raises a warning as an error (its own deprecation, say) sees
    it raised unchanged after one attempt, never retried nor turned into a stop for the model."""
    from openai.resources.chat.completions import Completions

    calls: list[str] = []

    class OldClientWarning(DeprecationWarning):
        pass

    def create(self: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["model"])
        raise OldClientWarning("this client's chat API is deprecated")

    monkeypatch.setattr(Completions, "create", create)
    with openai.OpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0) as raw, \
            pytest.raises(OldClientWarning):  # fmt: skip
        t_openai.run_agent(raw, model="gpt-6.1-terra", guard=Guard(),
                           messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert calls == ["gpt-6.1-terra"]


@pytest.mark.parametrize("shell", ["run_agent", "arun_agent"])
def test_a_programming_error_in_the_model_call_is_raised_after_the_run_is_filed(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shell: str
) -> None:
    """#40 case 7, run_agent: a model call that fails with a programming error (a TypeError of
    a bad call) is tried once and raised as it is, the run filed first (permanent_error);
    never the customer's "try again later"."""
    from openai.resources.chat.completions import AsyncCompletions, Completions

    calls: list[str] = []

    def create(self: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["model"])
        raise TypeError("create() got an unexpected keyword argument 'temprature'")

    async def acreate(self: Any, **kwargs: Any) -> Any:
        return create(self, **kwargs)

    monkeypatch.setattr(Completions, "create", create)
    monkeypatch.setattr(AsyncCompletions, "create", acreate)
    records = tether.Records.sqlite(str(tmp_path / "records.db"))
    guard = Guard(records=records, retry=tether.RetryPolicy(base=0.001, cap=0.002))
    user = [{"role": "user", "content": "hi"}]

    async def arun() -> None:
        async with openai.AsyncOpenAI(
            api_key="test", base_url=server.url + "/v1", max_retries=0
        ) as raw:
            await t_openai.arun_agent(raw, model="gpt-4.1", guard=guard, messages=user)

    with pytest.raises(TypeError, match="temprature"):
        if shell == "arun_agent":
            asyncio.run(arun())
        else:
            with openai.OpenAI(api_key="test", base_url=server.url + "/v1", max_retries=0) as raw:
                t_openai.run_agent(raw, model="gpt-4.1", guard=guard, messages=user)
    assert calls == ["gpt-4.1"]
    assert [r["reason"] for r in records.runs.list()] == ["permanent_error"]
