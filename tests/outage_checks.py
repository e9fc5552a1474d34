"""What every adapter's outage test checks (#40, case 4): a model provider answering
overloaded to everything, ``CONVERSATIONS`` conversations one after another on one Guard
with SQLite records. The conversations its breaker stopped end ``CIRCUIT_OPEN`` within
``Guard(outage_wait=10)`` with the outage message, as one incident with one case, and
few requests reach the provider."""

from __future__ import annotations

from collections import Counter

import tether
from tether import StopReason

CONVERSATIONS = 12
#: the loopback provider's overloaded answers: Anthropic's and OpenAI-compatible ones' 529,
#: Google's 503 (UNAVAILABLE)
OVERLOADED = {"error": {"message": "Overloaded", "type": "overloaded_error"}}
UNAVAILABLE = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}


def said(name: str) -> str:
    return str(getattr(tether.CustomerMessages(), name, name)).format(done="")


def check_one_incident(
    outs: list[tether.Outcome], sent: Counter[str], records: tether.Records, dependency: str
) -> None:
    """All but the first conversations (their failures trip the breaker) end CIRCUIT_OPEN
    within outage_wait with the outage message, in order; a call's attempts, then probes of the
    breaker, at most one a second within outage_wait (without a breaker: 5 a conversation,
    60); one case for the outage, holding every conversation it stopped."""
    assert len(outs) == CONVERSATIONS
    stopped = [o for o in outs if o.stopped_because is StopReason.CIRCUIT_OPEN]
    assert len(stopped) >= CONVERSATIONS - 2, [o.stopped_because.value for o in outs]
    # the wait for the breaker is bounded by outage_wait; a conversation that met the
    # provider before the breaker tripped had its own retries' waits first (7.5 s at most)
    assert all(o.usage.seconds <= 10 + 1 for o in outs[2:])
    assert max(o.usage.seconds for o in outs) <= 10 + 7.5 + 1
    assert max(sent.values()) <= 5 + 10 and sum(sent.values()) <= 40, sent
    assert {o.customer_message for o in stopped} == {said("outage")}
    assert {o.status for o in stopped} == {"escalated"}
    cases = records.handoffs.list(limit=100)
    assert len(cases) == 1
    assert cases[0]["incident"]["dependency"] == dependency
    assert {o.handoff.id for o in stopped} == {cases[0]["id"]}
    held, total = records.incidents.runs(cases[0]["id"])
    assert total == len(stopped) == len(held)


def figures(outs: list[tether.Outcome], sent: Counter[str], records: tether.Records) -> str:
    """The endings, seconds per conversation, requests and cases, for a report."""
    endings = Counter(o.stopped_because.value for o in outs)
    seconds = [round(o.usage.seconds, 1) for o in outs]
    cases = len(records.handoffs.list(limit=100))
    return (
        f"endings {dict(endings)}; seconds {min(seconds)}-{max(seconds)}; "
        f"requests {sum(sent.values())} (max {max(sent.values(), default=0)} in one); cases {cases}"
    )
