"""A dead letter's replay by a person, as the page (``tether serve``) and the CLI
(``tether dlq replay --by NAME``) both do it: the handler called at most once per intent
(:meth:`tether.DeadLetters.replay`), who ran it kept on the letter, and, once the handler
ran, the case of the letter's run resolved by that person, the case naming the letter and
the letter reaching the case through its run. An outage's incident is never closed by a
replay: it holds other conversations, and a person closes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tether.records._collections import CaseState, Replayed

if TYPE_CHECKING:
    from tether.records._records import Records

__all__ = ["case_of_run", "replay_letter"]


def case_of_run(records: Records, run_id: str) -> dict[str, Any] | None:
    """The case the run ``run_id`` filed (None: it filed none, or is gone)."""
    run = records.runs.get(run_id) if run_id else None
    case_id = (run or {}).get("handoff_id")
    if not case_id:
        return None
    try:
        return records.handoffs.get(str(case_id))
    except KeyError:
        return None


def replay_letter(
    records: Records,
    letter_id: str,
    handler: Callable[..., Any],
    *,
    by: str,
    at: float,
    force: bool = False,
    lookup: Callable[[str], Any] | None = None,
) -> Replayed:
    """Replay the dead letter ``letter_id`` for ``by`` (a person's name: required, a replay
    runs a side effect again) and return what it did (the handler's result in it); then the case of the letter's
    run, when it is open and not an outage's incident, is resolved by ``by`` at ``at``
    ("dead letter … replayed by …"), naming the letter. What the replay raises
    (:class:`tether.RedactedArguments`, :class:`tether.EffectInProgress`,
    :class:`tether.UnknownOutcome`, the handler's failure) is raised, and nothing is
    resolved. A replay that did not call the handler (its recorded result returned)
    changes neither the letter nor the case, unless the replay that called it could not
    mark the letter: then this one marks it in that replay's name and resolves the case."""
    by = by.strip() if isinstance(by, str) else ""
    if not by:
        raise ValueError("say who replays it: a replay runs a side effect again")
    letters = records.dead_letters
    letters.get(letter_id)  # a KeyError for no such letter, before anything runs
    replayed = letters._replay(letter_id, handler, by=by, force=force, lookup=lookup)
    letter = replayed.letter
    ran = replayed.ran or replayed.repaired
    case = case_of_run(records, letter.run_id) if ran else None
    if case is None or case.get("state") == CaseState.RESOLVED or case.get("incident"):
        return replayed
    note = f"dead letter {letter_id} replayed by {letter.replayed_by}: its handler ran"
    if replayed.repaired:  # an earlier replay ran it and could not mark the letter
        note += f" (the letter marked by {by[:100]})"
    try:
        records.handoffs.resolve(str(case["id"]), by=by, note=note, at=at, dead_letter=letter_id)
    except ValueError:  # another replay of the run's letters resolved it meanwhile
        if records.handoffs.get(str(case["id"])).get("state") != CaseState.RESOLVED:
            raise
    return replayed
