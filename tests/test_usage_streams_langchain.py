"""LangChain: a chat model's reply read whole and the same reply streamed (its chunks
summed by LangChain into one message) give one usage and one price under
``TetherMiddleware``, for the usage shapes LangChain's provider packages report, through
LangChain's own ``BaseChatModel`` and ``create_agent``, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from tether import Guard, Price, PriceTable
from tether.integrations.langchain import TetherMiddleware

MODEL = "claude-haiku-4-5"
PRICES = PriceTable({MODEL: Price(input=1.0, output=5.0, cache_write=1.25, cache_read=0.10)})

#: the usage of the whole reply: input_tokens hold the cached ones
WHOLE = {"input_tokens": 10500, "output_tokens": 200, "total_tokens": 10700,
         "input_token_details": {"cache_read": 8000, "cache_creation": 500}}  # fmt: skip
#: how each shape streams it (the chunks' usage, which LangChain sums)
STREAMS = {
    # langchain-anthropic: the prompt's tokens in message_start, the output's in message_delta
    "prompt-first": [
        {"input_tokens": 10500, "output_tokens": 0, "total_tokens": 10500,
         "input_token_details": {"cache_read": 8000, "cache_creation": 500}},
        None,
        {"input_tokens": 0, "output_tokens": 200, "total_tokens": 200},
    ],
    # langchain-openai (stream_usage=True): all of it in a last chunk of its own
    "usage-last": [None, None, WHOLE],
}  # fmt: skip


class Replies(BaseChatModel):
    """One reply, whole (``_generate``) or in three chunks (``_stream``), with its usage."""

    model_name: str = MODEL
    shape: str = "prompt-first"
    streaming: bool = False
    streamed: int = 0

    @property
    def _llm_type(self) -> str:
        return "replies"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:  # fmt: skip
        message = AIMessage("Hello there", usage_metadata=WHOLE,  # type: ignore[arg-type]
                            response_metadata={"model_name": MODEL})  # fmt: skip
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:  # fmt: skip
        self.streamed += 1
        texts = ["Hello", " there", ""]
        for text, used in zip(texts, STREAMS[self.shape], strict=True):
            meta = {"model_name": MODEL} if not text else {}
            chunk = AIMessageChunk(content=text, usage_metadata=used, response_metadata=meta)  # type: ignore[arg-type]
            yield ChatGenerationChunk(message=chunk)

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._stream(*args, **kwargs):
            yield chunk


def _outcome(shape: str, shell: str, stream: bool) -> tuple[Any, ...]:
    model = Replies(shape=shape, streaming=stream)
    agent = create_agent(model, tools=[], middleware=[TetherMiddleware(Guard(prices=PRICES))])
    said = {"messages": [("user", "hi")]}
    state = agent.invoke(said) if shell == "sync" else asyncio.run(agent.ainvoke(said))
    assert model.streamed == int(stream)
    outcome = state["tether_outcome"]
    u = outcome.usage
    return (u.model_calls, u.input_tokens, u.output_tokens, u.cache_write_tokens,
            u.cache_read_tokens, u.cost_usd)  # fmt: skip


@pytest.mark.parametrize("shell", ["sync", "async"])
@pytest.mark.parametrize("shape", STREAMS)
def test_a_streamed_langchain_reply_costs_what_the_whole_reply_costs(
    shape: str, shell: str
) -> None:
    """Uncached prompt = input - cache reads - cache writes; the cache's own prices."""
    price = PRICES.cost(MODEL, 2000, 200, 500, 8000)
    want = (1, 2000, 200, 500, 8000, pytest.approx(price))
    assert _outcome(shape, shell, stream=False) == want
    assert _outcome(shape, shell, stream=True) == want
