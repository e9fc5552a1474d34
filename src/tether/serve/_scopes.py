"""The budget scopes of a Redis store (``tether serve --redis``), else of the records database
(``BudgetScopes(records)``): each scope's limits, spend
in its window, calls in flight and the runs paused on it (read only: a limit is raised with
``tether scopes set`` or ``BudgetScopes.limit``)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from tether.serve._site import Area

__all__ = ["ScopePages"]


class ScopePages(Area):
    """/scopes."""

    def routes(self) -> list[Route]:
        return [Route("/scopes", self.site.page(self.scopes))]

    def scopes(self, request: Request) -> tuple[str, dict[str, Any]]:
        from tether.run._scopes import BudgetScopes

        redis = self.site.redis
        book = BudgetScopes(redis if redis is not None else self.site.records)
        rows = [book.view(name) for name in book.names()]
        return "scopes.html", {"scopes": rows}
