"""What every τ² policy shares: the turn cap, the prompt, how an episode ended, the guard a
tether user sets (its own module, so that the frameworks' policies in ``_tau_frameworks``
and the others in ``_tau_policies`` import it, not each other)."""

from __future__ import annotations

from dataclasses import dataclass

import tether
from tether.bench._tau_tools import describe_effect
from tether.bench._tau_world import MODEL, PRICE, Episode

__all__ = ["CRASH_TEXT", "MAX_TURNS", "PROMPT", "SYSTEM", "Ending", "guard_of", "told"]

MAX_TURNS = 40
ATTEMPTS = 8
PRICES = tether.PriceTable({MODEL: PRICE})
CRASH_TEXT = "Sorry, something went wrong on our side. Please try again."
PROMPT = "Hi, I need help with my orders."
SYSTEM = "You are a retail customer service agent. Follow the retail policy."


@dataclass(frozen=True, slots=True)
class Ending:
    """What the customer was told, and how the run ended."""

    text: str
    how: str  # "answer", "crash", or the tether outcome's status


def guard_of(episode: Episode, attempts: int = ATTEMPTS) -> tether.Guard:
    """What a user sets: the turn cap, the clock, how effects are told to the customer; a
    store of this episode's own (episodes are separate timelines, not one fleet), and a
    seed for the jitter (the bench is deterministic)."""
    return tether.Guard(
        budget=tether.Budget(max_steps=MAX_TURNS),
        clock=episode.clock,
        prices=PRICES,
        retry=tether.RetryPolicy(max_attempts=attempts, seed=episode.rng_seed),
        store=tether.stores.MemoryStore(),
        describe_effect=describe_effect,
    )


def told(outcome: tether.Outcome) -> Ending:
    if outcome.status == "success":
        return Ending(str(outcome.result or ""), "success")
    return Ending(outcome.customer_message, f"{outcome.status}:{outcome.stopped_because.name}")
