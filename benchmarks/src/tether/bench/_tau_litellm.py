"""The τ² suite's LiteLLM policies (in ``.venv-crewai``, where LiteLLM is installed): the
loop a user writes around ``litellm.acompletion``, alone and through tether, on the suite's
scripted model (answering in OpenAI's chat shape through the OpenAI SDK's transport seam,
which LiteLLM's ``openai/`` provider drives when given the client) and faults.

* ``litellm``: ``litellm.acompletion(..., num_retries=2)`` as LiteLLM's docs set it, the
  OpenAI SDK's own two retries under it; the tools called as the model asks, an error told
  back to the model.
* ``tether-litellm``: ``tether.integrations.litellm.acompletion(run, ...)`` (tether the one
  retry layer) in ``while run.proceed()``, each tool through ``run.acall_tool`` with the
  writes declared and their lookups.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tether.bench._tau_common import ATTEMPTS, CRASH_TEXT, MAX_TURNS, PROMPT, SYSTEM, Ending
from tether.bench._tau_common import guard_of as _guard
from tether.bench._tau_common import told as _told
from tether.bench._tau_domain import WRITES
from tether.bench._tau_tools import ASYNC, LOOKUPS
from tether.bench._tau_world import MODEL

__all__ = ["litellm_loop"]

_CLIENTS: dict[int | None, Any] = {}


def _client(retries: int | None) -> Any:
    """The OpenAI SDK's client over the suite's transport (``retries`` None: its default)."""
    if retries not in _CLIENTS:
        import httpx2
        import openai

        from tether.bench._tau_formats import openai_transport

        options: Any = {} if retries is None else {"max_retries": retries}
        _CLIENTS[retries] = openai.AsyncOpenAI(
            api_key="bench",
            base_url="http://model.bench/v1",
            http_client=httpx2.AsyncClient(transport=openai_transport()),
            **options,
        )
    return _CLIENTS[retries]


def _tools() -> list[dict[str, Any]]:
    from tether import Tool

    return [{"type": "function", "function": {"name": name, "description": "",
             "parameters": Tool(name, fn).schema}} for name, fn in ASYNC.items()]  # fmt: skip


def _said(reply: Any) -> dict[str, Any]:
    message = reply.choices[0].message
    calls = [{"id": c.id, "type": "function",
              "function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in message.tool_calls or ()]  # fmt: skip
    return {"role": "assistant", "content": message.content, "tool_calls": calls or None}


async def litellm_loop(episode: Any, tethered: bool) -> Ending:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": PROMPT},
    ]
    ask: dict[str, Any] = {"model": f"openai/{MODEL}", "tools": _tools(), "max_tokens": 1024}
    if not tethered:
        for _ in range(MAX_TURNS):
            try:
                reply = await litellm.acompletion(
                    messages=messages, client=_client(None), num_retries=2, **ask
                )
            except Exception:
                return Ending(CRASH_TEXT, "crash")
            said = _said(reply)
            messages.append(said)
            if not said["tool_calls"]:
                return Ending(str(said["content"] or ""), "answer")
            for call in said["tool_calls"]:
                name = call["function"]["name"]
                try:
                    out = await ASYNC[name](**json.loads(call["function"]["arguments"] or "{}"))
                except Exception as exc:  # the error goes back to the model, as people write it
                    out = f"{type(exc).__name__}: {exc}"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(out)})
        return Ending(CRASH_TEXT, "crash")

    import tether
    from tether import Stopped, ToolError
    from tether.integrations.litellm import acompletion

    # the guarded clients' default (five attempts, the provider's breaker), seeded
    breaker = tether.breakers.get("openai:http://model.bench/v1", failure_threshold=10)
    policy = tether.RetryPolicy(name="openai", max_attempts=ATTEMPTS, seed=episode.rng_seed,
                                breaker=breaker)  # fmt: skip

    async with _guard(episode).start(PROMPT) as run:
        try:
            while run.proceed():
                said = _said(
                    await acompletion(
                        run, messages=messages, client=_client(0), policy=policy, **ask
                    )
                )
                messages.append(said)
                if not said["tool_calls"]:
                    run.succeed(said["content"] or "")
                    break
                for call in said["tool_calls"]:
                    name = call["function"]["name"]
                    args = json.loads(call["function"]["arguments"] or "{}")
                    try:
                        out = await run.acall_tool(name, ASYNC[name], args,
                                                   idempotent=name not in WRITES,
                                                   lookup=LOOKUPS.get(name))  # fmt: skip
                    except ToolError as exc:
                        out = exc.model_message
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": str(out)}
                    )
        except Stopped:
            pass
    return _told(run.outcome)
