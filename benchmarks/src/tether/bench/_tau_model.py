"""The scripted model of a τ² task: it replays the golden actions, and reacts as an LLM does.

One :class:`ScriptedModel` per episode decides each turn from the result of its last tool
call, read from the request in the provider's own format (Anthropic Messages, OpenAI chat
completions, LangChain messages):

* a result that looks right: the next golden action (one tool call per turn, as the
  policy asks), then the answer;
* the domain's refusal (``"Error: ..."``): the model believes it and moves on, telling the
  customer that this write could not be done;
* a failure of any other kind (an exception as text, a framework's error message): it
  re-issues the same call, at most twice; a write that keeps failing is reported as not
  done; a read that keeps failing ends the conversation with an apology;
* after a read that failed and then worked, it sometimes reads the same thing once more
  (a loop on a read).

The answer states, for each write of the task, ``[completed: tool target]`` or
``[could not complete: tool target]``: what the customer is told.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.bench._tau_domain import WRITES, target_of

__all__ = ["Answer", "Call", "ScriptedModel", "claims_of", "draw"]

TRANSFER_MESSAGE = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."
GAVE_UP = "I'm sorry: our systems are not answering, so I could not finish your request."
#: Re-issues of a call whose result was a failure, before the model gives up on it.
REISSUES = 2
#: How often the model reads again what it read after a failed read worked (a loop).
LOOP_P = 0.3
#: The prompt the model reads on every turn (the policy and the tools' schemas), in tokens.
PROMPT_TOKENS = 2600

_USER_ID = re.compile(r"[a-z]+(?:_[a-z]+)*_\d+")
_CLAIM = re.compile(r"\[(completed|could not complete): ([a-z_]+)(?: ([^\]\s]+))?\]")


def draw(*parts: object) -> float:
    """A deterministic number in [0, 1) for ``parts`` (the seed, the task, the call...)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call the model asks for."""

    id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Answer:
    """The model's answer to the customer."""

    text: str


def _looks_right(name: str, text: str) -> bool:
    if name.startswith("find_user_id"):
        return _USER_ID.fullmatch(text) is not None
    if name == "calculate":
        try:
            float(text)
        except ValueError:
            return False
        return True
    if name == "transfer_to_human_agents":
        return text == "Transfer successful"
    return text[:1] == "{"


@dataclass
class ScriptedModel:
    """The golden actions of one task, replayed turn by turn (see the module)."""

    actions: Sequence[Mapping[str, Any]]
    seed: str
    id_prefix: str = "call_"
    turns: int = 0
    chars_seen: int = 0
    _i: int = 0
    _last: Call | None = None
    _failures: int = 0
    _looped: bool = False
    _gave_up: bool = False
    _beliefs: dict[int, str] = field(default_factory=dict)

    def decide(self, results: Mapping[str, tuple[str, bool]]) -> Call | Answer:
        """The next turn, given the results (text, flagged as an error) by tool call id."""
        self.turns += 1
        if self._last is not None:
            text, flagged = results.get(self._last.id, ("(no result)", True))
            self.chars_seen += len(text)
            self._observe(text, flagged)
        if self._gave_up or self._i >= len(self.actions):
            self._last = None
            return Answer(self.answer())
        action = self.actions[self._i]
        self._last = Call(
            f"{self.id_prefix}{self.turns}", action["name"], dict(action["arguments"])
        )
        self.chars_seen += len(json.dumps(self._last.args))
        return self._last

    def _observe(self, text: str, flagged: bool) -> None:
        action = self.actions[self._i]
        name = str(action["name"])
        write = name in WRITES
        if not flagged and text.startswith("Error: "):  # the domain refused: believed
            if write:
                self._beliefs[self._i] = "refused"
            self._advance()
        elif not flagged and _looks_right(name, text):
            if write:
                self._beliefs[self._i] = "done"
            if (
                not write
                and self._failures
                and not self._looped
                and draw(self.seed, self._i, "loop") < LOOP_P
            ):
                self._looped = True  # reads it once more
                return
            self._advance()
        else:
            self._failures += 1
            if self._failures <= REISSUES:
                return  # the same call again
            if write:
                self._beliefs[self._i] = "failed"
                self._advance()
            else:
                self._gave_up = True

    def _advance(self) -> None:
        self._i += 1
        self._failures = 0
        self._looped = False

    def answer(self) -> str:
        """What the customer is told: every write of the task, done or not."""
        parts = []
        transferred = False
        for j, action in enumerate(self.actions):
            name = str(action["name"])
            if name not in WRITES:
                continue
            done = self._beliefs.get(j) == "done"
            transferred |= done and name == "transfer_to_human_agents"
            label = "completed" if done else "could not complete"
            parts.append(
                f"[{label}: {name} {target_of(name, dict(action['arguments']))}]".replace(" ]", "]")
            )
        head = (
            GAVE_UP
            if self._gave_up
            else ("Here is what I did." if parts else "Here is what I found.")
        )
        text = " ".join([head, *parts])
        return f"{text} {TRANSFER_MESSAGE}" if transferred else text

    @property
    def output_tokens(self) -> int:
        """Tokens of the last turn's output (a tool call or the answer)."""
        if self._last is not None:
            return 30 + len(json.dumps(self._last.args)) // 4
        return 20 + len(self.answer()) // 4

    @property
    def input_tokens(self) -> int:
        """Tokens of the request the model just read: the prompt and the conversation."""
        return PROMPT_TOKENS + self.chars_seen // 4


def claims_of(text: str) -> tuple[dict[tuple[str, str], str], str | None]:
    """What an ending tells the customer: per (tool, target), "done" or "failed"; and what
    it says of the rest: "failed" (a generic failure), or None (nothing, or a person
    will follow up)."""
    claims: dict[tuple[str, str], str] = {}
    for label, tool, target in _CLAIM.findall(text):
        claims[(tool, target or "")] = "done" if label == "completed" else "failed"
    lower = text.lower()
    generic: str | None = None
    if not claims and not any(p in lower for p in _NO_CLAIM):
        generic = "failed"  # an error message, a crash, a limit: "it did not work"
    elif any(p in lower for p in _FAILED):
        generic = "failed"
    return claims, generic


#: Endings that make no claim about what is not listed: a person follows up, or it is unknown.
_NO_CLAIM = (
    "here is what i found",
    "team now has your case",
    "could not confirm",
    "can pick up the rest",
    "needs a person's approval",
    "your request is complete",
)
#: Endings that say the request failed.
_FAILED = ("could not complete this request", "please try again")
