"""Loop detection: same action again, same sequence again, same state again, no progress.

Every detector keeps memory bounded by its window, so a run of a million steps costs
the same memory as a run of a hundred.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tether._outcome import StopReason

__all__ = ["LoopPolicy", "LoopState"]


def _default_allow() -> Mapping[str, int]:
    return MappingProxyType({"job_status": 30})


@dataclass(frozen=True, slots=True)
class LoopPolicy:
    """When repetition means stuck.

    * ``max_repeats``: the N-th identical call (same tool, same canonical arguments,
      within the last ``window`` calls) is refused before it runs; also the number of
      repetitions of a sequence (A B A B ...) or of a state that counts as a loop.
    * ``allow_repeat``: tools that legitimately repeat (polling) with their own cap of
      identical calls; they count neither against ``max_repeats`` nor ``max_no_progress``.
    * ``min_steps``: no detection before this many steps (false positives are a bug).
    * ``max_no_progress``: consecutive steps that add no new fact stop the run.
    * ``detect_cycles``: stop when an observed state repeats (``run.observe_state``).
    * ``max_period``: the longest sequence the period detector looks for.
    """

    max_repeats: int = 3
    allow_repeat: Mapping[str, int] = field(default_factory=_default_allow)
    min_steps: int = 0
    max_no_progress: int | None = 5
    detect_cycles: bool = True
    window: int = 64
    max_period: int = 4
    state_window: int = 1024

    def __post_init__(self) -> None:
        if self.max_repeats < 2:
            raise ValueError(f"max_repeats must be >= 2, got {self.max_repeats!r}")
        if self.min_steps < 0:
            raise ValueError(f"min_steps must be >= 0, got {self.min_steps!r}")
        if self.max_no_progress is not None and self.max_no_progress < 1:
            raise ValueError(f"max_no_progress must be >= 1 or None, got {self.max_no_progress!r}")
        if self.window < self.max_repeats:
            raise ValueError(
                f"window must be >= max_repeats ({self.max_repeats}), got {self.window!r}"
            )
        if self.max_period < 1:
            raise ValueError(f"max_period must be >= 1, got {self.max_period!r}")
        if self.state_window < 1:
            raise ValueError(f"state_window must be >= 1, got {self.state_window!r}")
        for tool, cap in self.allow_repeat.items():
            if not isinstance(cap, int) or cap < 1:
                raise ValueError(f"allow_repeat[{tool!r}] must be an int >= 1, got {cap!r}")
        object.__setattr__(self, "allow_repeat", MappingProxyType(dict(self.allow_repeat)))


class LoopState:
    """The detectors of one run."""

    __slots__ = ("_allowed", "_counts", "_recent", "_seq", "_states", "policy")

    def __init__(self, policy: LoopPolicy) -> None:
        self.policy = policy
        self._recent: deque[str] = deque()  # action hashes in the window
        self._counts: Counter[str] = Counter()  # of the window
        self._allowed: Counter[str] = Counter()  # allow_repeat tools: per action, whole run
        self._seq: deque[str] = deque(maxlen=policy.max_period * policy.max_repeats)
        self._states: OrderedDict[str, int] = OrderedDict()

    def check_action(self, tool: str, action: str, step: int) -> tuple[StopReason, str] | None:
        """Why this call must not run (a repeat or a sequence), or None. Does not record."""
        cap = self.policy.allow_repeat.get(tool)
        if cap is not None:
            if self._allowed[action] + 1 > cap:
                why = f"{tool} called {cap} times with identical arguments (its allow_repeat cap)"
                return StopReason.REPEATED_ACTION, why
            return None
        if step <= self.policy.min_steps:
            return None
        n = self._counts[action] + 1
        if n >= self.policy.max_repeats:
            return (
                StopReason.REPEATED_ACTION,
                f"{tool} would run a {_nth(n)} time with identical arguments",
            )
        period = self._period(action) if n > 1 else 0  # a new action completes no cycle
        if period:
            why = f"the last {period} actions would repeat {self.policy.max_repeats} times in a row"
            return StopReason.REPEATED_SEQUENCE, why
        return None

    def _period(self, action: str) -> int:
        seq = [*self._seq, action]
        reps = self.policy.max_repeats
        for p in range(2, self.policy.max_period + 1):
            span = p * reps
            if len(seq) < span:
                break
            tail = seq[-span:]
            block = tail[:p]
            if len(set(block)) > 1 and all(tail[i] == block[i % p] for i in range(span)):
                return p
        return 0

    def record_action(self, tool: str, action: str) -> None:
        if tool in self.policy.allow_repeat:
            self._allowed[action] += 1
            if len(self._allowed) > self.policy.state_window:  # bound memory
                self._allowed = Counter(dict(self._allowed.most_common(self.policy.state_window)))
            return
        self._recent.append(action)
        self._counts[action] += 1
        if len(self._recent) > self.policy.window:
            old = self._recent.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._seq.append(action)

    def observe_state(self, state: str, step: int) -> bool:
        """Record a state hash; True when it repeats a state already seen (a cycle)."""
        seen = state in self._states
        self._states[state] = step
        self._states.move_to_end(state)
        while len(self._states) > self.policy.state_window:
            self._states.popitem(last=False)
        return seen and self.policy.detect_cycles and step > self.policy.min_steps


def _nth(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")
