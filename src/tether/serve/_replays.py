"""Replays: the dead letters, one letter with its last replay, and the replay itself (at
most once per intent, through the ledger, by the handler ``tether serve --handler``
names)."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from tether._errors import EffectInProgress
from tether.records._collections import CaseState, RedactedArguments, check_run_id
from tether.serve._site import Area
from tether.serve._values import preview, short

__all__ = ["Replays"]

_log = logging.getLogger("tether")


class Replays(Area):
    """/dead-letters, /dead-letters/{letter_id} and its replay."""

    def routes(self) -> list[Route]:
        page, action = self.site.page, self.site.action
        return [
            Route("/dead-letters", page(self.letters)),
            Route("/dead-letters/{letter_id}", page(self.letter)),
            Route("/dead-letters/{letter_id}/replay", action(self.replay), methods=["POST"]),
        ]

    def letters(self, request: Request) -> tuple[str, dict[str, Any]]:
        letters = sorted(self.site.records.dead_letters.list(limit=500), key=lambda d: -d.at)
        return "dead_letters.html", {
            "letters": [short(letter.to_doc()) for letter in letters],
            "can_replay": self.site.handler is not None,
        }

    def letter(self, request: Request) -> tuple[str, dict[str, Any]]:
        letter_id = check_run_id(request.path_params["letter_id"], "a dead letter id")
        letters = self.site.records.dead_letters
        letter = letters.get(letter_id)
        replay = letters.last_replay(letter_id)
        if replay is not None and "result" in replay:
            replay["result"] = preview(replay["result"])
        case = self._case(letter.run_id)
        return "dead_letter.html", {
            "letter": short(letter.to_doc()),
            "args": preview(letter.args),
            "replay": short(replay) if replay is not None else None,
            "can_replay": self.site.handler is not None,
            "case": short(case) if case is not None else None,
        }

    def _case(self, run_id: str) -> dict[str, Any] | None:
        """The case of the letter's run (None: its run filed none, or is gone)."""
        records = self.site.records
        run = records.runs.get(run_id) if run_id else None
        case_id = (run or {}).get("handoff_id")
        if not case_id:
            return None
        try:
            return records.handoffs.get(str(case_id))
        except KeyError:
            return None

    def replay(self, request: Request, form: dict[str, str]) -> str:
        letter_id = check_run_id(request.path_params["letter_id"], "a dead letter id")
        handler = self.site.handler
        if handler is None:
            raise ValueError("no replay handler: start tether serve with --handler module:function")
        by = form.get("by", "").strip()
        if not by:
            raise ValueError("say who replays it (the 'by' field)")
        letters = self.site.records.dead_letters
        letter = letters.get(letter_id)  # a KeyError (404) for no such letter, before anything runs
        try:
            letters.replay(letter_id, handler, by=by)  # at most once per intent, via the ledger
        except RedactedArguments:
            raise
        except EffectInProgress:  # another replay's handler still runs: not a failure
            raise ValueError(
                f"{letter_id} is being replayed right now (its handler has not ended): this "
                "replay did not call it. Its page shows how it ends."
            ) from None
        except Exception as exc:  # the handler's failure: the letter's page shows it
            _log.warning("tether serve: the replay of %s failed: %s", letter_id, type(exc).__name__)
            return f"/dead-letters/{letter_id}#replay"
        # the replay did what the run could not: the run's case is closed, linked to the letter
        # (an outage's incident holds other runs: a person closes it)
        case = self._case(letter.run_id)
        if (
            case is not None
            and case.get("state") != CaseState.RESOLVED
            and not case.get("incident")
        ):
            self.site.records.handoffs.resolve(
                str(case["id"]),
                by=by,
                note=f"dead letter {letter_id} replayed by {by[:100]}: its handler ran",
                at=self.site.clock(),
                dead_letter=letter_id,
            )
        return f"/dead-letters/{letter_id}#replay"
