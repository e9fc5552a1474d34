"""The breakers of a Redis store (``tether serve --redis``): their states, force open,
close."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from tether.serve._site import Area
from tether.stores._logic import BreakerState

__all__ = ["BreakerPages"]


class BreakerPages(Area):
    """/breakers and the action that forces one open or closed."""

    def routes(self) -> list[Route]:
        return [
            Route("/breakers", self.site.page(self.breakers)),
            Route("/breakers/{name}/{state:str}", self.site.action(self.force), methods=["POST"]),
        ]

    def breakers(self, request: Request) -> tuple[str, dict[str, Any]]:
        rows = []
        redis = self.site.redis
        if redis is not None:
            now = self.site.clock()
            for name in redis.breaker_names():
                state, retry_at = redis.breaker_state(name, now)
                retry_in = max(0.0, retry_at - now) if state == BreakerState.OPEN else 0.0
                rows.append({"name": name, "state": state, "retry_in": retry_in})
        return "breakers.html", {"breakers": rows}

    def force(self, request: Request, form: dict[str, str]) -> str:
        redis = self.site.redis
        if redis is None:
            raise ValueError("no Redis store: start tether serve with --redis URL")
        name = request.path_params["name"]
        is_open = request.path_params["state"] == BreakerState.OPEN
        seconds = float(form.get("seconds") or 60)
        if is_open and not 0 < seconds <= 86_400:
            raise ValueError("seconds must be between 0 and 86400")
        state = BreakerState.OPEN if is_open else BreakerState.CLOSED
        redis.breaker_force(name, state, seconds)
        return "/breakers"
