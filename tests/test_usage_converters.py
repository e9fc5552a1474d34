"""One usage converter per provider, in its profile (tether.providers), none outside: no
other module reads a provider's token fields off a reply."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tether"

#: the providers' own names for their token counts (tether's own are input_tokens,
#: output_tokens, cache_write_tokens, cache_read_tokens)
FIELDS = {
    # OpenAI chat, LiteLLM, Anthropic, the Responses API
    "prompt_tokens", "completion_tokens", "prompt_tokens_details", "input_tokens_details",
    "cached_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
    # LangChain, Gemini, Bedrock, CrewAI
    "usage_metadata", "input_token_details", "prompt_token_count", "candidates_token_count",
    "cached_content_token_count", "thoughts_token_count", "inputTokens", "outputTokens",
    "cacheReadInputTokens", "cacheWriteInputTokens", "_token_usage", "cached_prompt_tokens",
    "cache_creation_tokens",
}  # fmt: skip


def readers(path: Path) -> list[str]:
    """Where ``path`` reads a provider's token field: an attribute, or a name in a string
    (``getattr``, ``.get``, a subscript); a key of a dict it writes is not a read."""
    tree = ast.parse(path.read_text())
    written = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FIELDS:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in FIELDS and id(node) not in written:
            found.append(f"{path.name}:{node.lineno} {node.value!r}")
    return found


def test_only_the_provider_profiles_read_a_replys_usage() -> None:
    outside = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if not path.is_relative_to(SRC / "providers")
        for hit in readers(path)
    ]
    assert outside == []


def test_the_check_sees_a_read() -> None:
    """The check finds what it looks for (a profile reads these fields)."""
    assert readers(SRC / "providers" / "openai_chat.py")
    assert readers(SRC / "providers" / "google.py")
