"""Replays: the dead letters, one letter with its last replay, and the replay itself (at
most once per intent, through the ledger, by the handler ``tether serve --handler``
names)."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from tether._errors import EffectInProgress
from tether.records._collections import RedactedArguments, check_run_id
from tether.records._replay import case_of_run, replay_letter
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
        case = case_of_run(self.site.records, letter.run_id)
        return "dead_letter.html", {
            "letter": short(letter.to_doc()),
            "args": preview(letter.args),
            "replay": short(replay) if replay is not None else None,
            "can_replay": self.site.handler is not None,
            "case": short(case) if case is not None else None,
        }

    def replay(self, request: Request, form: dict[str, str]) -> str:
        letter_id = check_run_id(request.path_params["letter_id"], "a dead letter id")
        handler = self.site.handler
        if handler is None:
            raise ValueError("no replay handler: start tether serve with --handler module:function")
        by = form.get("by", "").strip()
        if not by:
            raise ValueError("say who replays it (the 'by' field)")
        self.site.records.dead_letters.get(letter_id)  # a KeyError (404): no such letter
        try:  # at most once per intent, via the ledger; the run's case resolved by `by`
            replay_letter(self.site.records, letter_id, handler, by=by, at=self.site.clock())
        except RedactedArguments:
            raise
        except EffectInProgress:  # another replay's handler still runs: not a failure
            who = self.site.records.dead_letters.get(letter_id).replaying_by
            raise ValueError(
                f"{letter_id} is being replayed right now{f' by {who}' if who else ''} (its "
                "handler has not ended): this replay did not call it. Its page shows how it ends."
            ) from None
        except Exception as exc:  # the handler's failure: the letter's page shows it
            _log.warning("tether serve: the replay of %s failed: %s", letter_id, type(exc).__name__)
        return f"/dead-letters/{letter_id}#replay"
