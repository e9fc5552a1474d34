"""tether around agent frameworks and the official LLM SDKs (``tether.integrations.anthropic``,
``.openai``, ``.langchain``, ...). The per-tool options every adapter takes are typed here
once: :data:`SideEffects` and :class:`ToolOptions`."""

from tether.integrations._tool_options import SideEffects, ToolOptions

__all__ = ["SideEffects", "ToolOptions"]
