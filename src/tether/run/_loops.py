"""Loop detection: same action again, same sequence again, same state again, no progress.

Every detector keeps memory bounded by its window, so a run of a million steps costs
the same memory as a run of a hundred.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import field
from types import MappingProxyType
from typing import Any

from tether._frozen import Value, frozen_dataclass
from tether.run._outcome import StopReason

__all__ = ["LoopPolicy", "LoopState"]


#: The cap of identical calls a polling tool named without one gets.
DEFAULT_POLL_CAP = 30


def _default_allow() -> Mapping[str, int]:
    return MappingProxyType({"job_status": DEFAULT_POLL_CAP})


def _whole(name: str, value: object, least: int, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        more = " or None" if optional else ""
        raise ValueError(f"{name} must be an int >= {least}{more}, got {value!r}")


def _caps(allow: object) -> dict[str, int]:
    """allow_repeat as a mapping of tool name to cap."""
    if isinstance(allow, str) or not isinstance(allow, Mapping | Iterable):
        raise TypeError(
            "allow_repeat must be a mapping of tool name to cap ({'job_status': 30}) or a list "
            f"of tool names, got {allow!r}"
        )
    caps = dict(allow) if isinstance(allow, Mapping) else dict.fromkeys(allow, DEFAULT_POLL_CAP)
    for tool, cap in caps.items():
        if not isinstance(tool, str):
            raise TypeError(f"allow_repeat names tools by str, got {tool!r}")
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"allow_repeat[{tool!r}] must be an int >= 1, got {cap!r}")
    return caps


@frozen_dataclass
class LoopPolicy(Value):
    """When repetition means stuck.

    * ``max_repeats``: the N-th identical call (same tool, same canonical arguments,
      within the last ``window`` calls) is refused before it runs; also the number of
      repetitions of a sequence (A B A B ...) that counts as a loop. None switches
      repeat and sequence detection off.
    * ``window``: how many recent calls the repeat detector remembers; by default it
      follows ``max_repeats`` (``max(64, 4 * max_repeats)``).
    * ``allow_repeat``: tools that legitimately repeat (polling) with their own cap of
      identical calls (a mapping of name to cap, or names that get a cap of 30); they
      count neither against ``max_repeats`` nor ``max_no_progress``.
    * ``min_steps``: no detection before this many steps (false positives are a bug).
    * ``max_no_progress``: consecutive steps that add no new fact stop the run.
    * ``detect_cycles``: stop when an observed state repeats (``run.observe_state``).
    * ``max_period``: the longest sequence the period detector looks for.
    """

    max_repeats: int | None = 3
    allow_repeat: Mapping[str, int] = field(default_factory=_default_allow)
    min_steps: int = 0
    max_no_progress: int | None = 5
    detect_cycles: bool = True
    window: int | None = None
    max_period: int = 4
    state_window: int = 1024

    def __post_init__(self) -> None:
        _whole("max_repeats", self.max_repeats, 2, optional=True)
        _whole("min_steps", self.min_steps, 0)
        _whole("max_no_progress", self.max_no_progress, 1, optional=True)
        _whole("window", self.window, 1, optional=True)
        _whole("max_period", self.max_period, 1)
        _whole("state_window", self.state_window, 1)
        if not isinstance(self.detect_cycles, bool):
            raise TypeError(f"detect_cycles must be True or False, got {self.detect_cycles!r}")
        repeats = self.max_repeats or 2
        if self.window is None:
            object.__setattr__(self, "window", max(64, 4 * repeats))
        elif self.window < repeats:
            raise ValueError(f"window must be >= max_repeats ({repeats}), got {self.window!r}")
        object.__setattr__(self, "allow_repeat", MappingProxyType(_caps(self.allow_repeat)))


class LoopState:
    """The detectors of one run."""

    __slots__ = (
        "_allow",
        "_allowed",
        "_counts",
        "_done",
        "_flying",
        "_min_steps",
        "_recent",
        "_repeats",
        "_seq",
        "_states",
        "_window",
        "policy",
    )

    def __init__(self, policy: LoopPolicy) -> None:
        self.policy = policy
        # the settings read on every call, kept at hand (the policy is frozen)
        self._allow = policy.allow_repeat
        self._repeats = policy.max_repeats
        self._min_steps = policy.min_steps
        self._recent: deque[str] = deque()  # action hashes in the window
        self._counts: Counter[str] = Counter()  # of the window
        self._allowed: Counter[str] = Counter()  # allow_repeat tools: per action, whole run
        self._seq: deque[str] = deque(maxlen=policy.max_period * (policy.max_repeats or 2))
        self._window: int = policy.window or 64
        self._states: OrderedDict[str, int] = OrderedDict()
        # the calls checked and not ended yet, by action: parallel calls of one model turn
        # (identical ones started together) count as repeats before any of them completes
        self._flying: dict[str, int] = {}
        # calls completed and not recorded yet (still in flight): a completion appends here
        # without a lock (a deque's append is atomic); :meth:`settle` records them, under the
        # run's admission lock, before the next check (or a snapshot) reads the detectors
        self._done: deque[tuple[str, str, bool]] = deque()

    def load(self, saved: Mapping[str, Any]) -> None:
        """Take the detectors' state a run document kept (``loops``)."""
        self._recent = deque(str(a) for a in saved.get("recent") or ())
        self._counts = Counter({str(k): int(v) for k, v in (saved.get("counts") or {}).items()})
        self._allowed = Counter({str(k): int(v) for k, v in (saved.get("allowed") or {}).items()})
        self._seq = deque((str(a) for a in saved.get("seq") or ()), maxlen=self._seq.maxlen)
        self._states = OrderedDict((str(k), int(v)) for k, v in saved.get("states") or ())

    def check_action(
        self, tool: str, action: str, step: int, cap: int | None = None
    ) -> tuple[StopReason, str] | None:
        """Why this call must not run (a repeat or a sequence), or None. Does not record.
        ``cap``: the call's own repeat cap, as if its tool were in ``allow_repeat``."""
        cap = self._allow.get(tool) if cap is None else cap
        flying = self._flying.get(action, 0) if self._flying else 0
        if cap is not None:
            if self._allowed[action] + flying + 1 > cap:
                why = f"{tool} called {cap} times with identical arguments (its allow_repeat cap)"
                return StopReason.REPEATED_ACTION, why
            return None
        repeats = self._repeats
        if step <= self._min_steps or repeats is None:
            return None
        n = self._counts.get(action, 0) + flying + 1  # .get: a new action: no __missing__
        if n >= repeats:
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
        reps = self.policy.max_repeats or 2
        for p in range(2, self.policy.max_period + 1):
            span = p * reps
            if len(seq) < span:
                break
            tail = seq[-span:]
            block = tail[:p]
            if len(set(block)) > 1 and all(tail[i] == block[i % p] for i in range(span)):
                return p
        return 0

    def begin_action(self, action: str) -> None:
        """A call checked by :meth:`check_action` is on its way (until :meth:`end_action`)."""
        self._flying[action] = self._flying.get(action, 0) + 1

    def end_action(self, action: str) -> None:
        """A call begun is over (completed, failed, refused or not made)."""
        left = self._flying.get(action, 0) - 1
        if left > 0:
            self._flying[action] = left
        else:
            self._flying.pop(action, None)

    def complete(self, tool: str, action: str, allowed: bool) -> None:
        """A call begun completed: recorded (and out of flight) at the next :meth:`settle`."""
        self._done.append((tool, action, allowed))

    def settle(self) -> None:
        """The completed calls recorded, each out of flight as it is recorded (the caller
        holds the run's admission lock)."""
        done = self._done
        while done:
            tool, action, allowed = done.popleft()
            self.end_action(action)
            self.record_action(tool, action, allowed=allowed)

    def record_action(self, tool: str, action: str, *, allowed: bool = False) -> None:
        if allowed or tool in self._allow:
            self._allowed[action] += 1
            if len(self._allowed) > self.policy.state_window:  # bound memory
                self._allowed = Counter(dict(self._allowed.most_common(self.policy.state_window)))
            return
        counts = self._counts
        self._recent.append(action)
        counts[action] = counts.get(action, 0) + 1  # .get: a new action costs no __missing__
        if len(self._recent) > self._window:
            old = self._recent.popleft()
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                counts.pop(old)  # dict's own: Counter's ``del`` is a Python method
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
