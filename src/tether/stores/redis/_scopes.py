"""Budget scopes shared by a fleet through Redis: the Lua twin of :mod:`tether.stores._scopes`.

Every key of a store's scopes carries one hash tag, ``{<prefix>:scopes}``: a call's scopes
(any combination of names: a tenant's and a user's) are then in one hash slot, so that on
Redis Cluster one script reserves the call in all of them at once, atomically, in one
round trip. The price: one node of a cluster holds every scope of one prefix (a handful of
small hashes per scope); a fleet with very many tenants can split them over several
prefixes, each a :class:`tether.BudgetScopes` of its own.

When Redis cannot be reached the scopes fail closed: the call is refused with
:class:`tether.StoreUnavailable` (a budget this process alone kept would let every process
spend the whole limit), never counted in this process's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tether._errors import StoreUnavailable
from tether.stores._scopes import DIMENSIONS, Answer, Four, ScopeLimits
from tether.stores.redis._connection import text

if TYPE_CHECKING:
    from tether.stores.redis._connection import Connection

__all__ = ["Scopes"]


def _num(value: Any) -> float | None:
    t = text(value)
    return float(t) if t else None


class Scopes:
    """The budget scope operations of a :class:`~tether.stores.RedisStore` (see the module)."""

    def __init__(
        self, conn: Connection, *, lease: float = 600.0, retention: float = 7 * 86_400.0
    ) -> None:
        self.conn = conn
        self.lease, self.retention = float(lease), float(retention)
        self.tag = f"{{{conn.prefix}:scopes}}"

    def _keys(self, names: Sequence[str]) -> list[str]:
        return [
            f"{self.tag}:calls",
            f"{self.tag}:calls_t",
            f"{self.tag}:names",
            *(f"{self.tag}:scope:{n}" for n in names),
        ]

    def _args(self, mode: str, now: float, call_id: str = "") -> list[Any]:
        return [mode, self.conn.when(now), self.lease, self.retention, call_id]

    def _failed(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"Redis at {self.conn.url} could not be reached ({type(exc).__name__}): the budget "
            "scopes cannot be checked, so no request was sent"
        )

    def _run(self, keys: list[str], args: list[Any]) -> Any:
        self.conn.round_trips += 1
        self.conn.scripts_run["scopes"] += 1
        try:
            return self.conn.scripts["scopes"](keys=keys, args=args)
        except self.conn.errors as exc:
            raise self._failed(exc) from exc

    async def _arun(self, keys: list[str], args: list[Any]) -> Any:
        if self.conn._aurl is None and self.conn._aclient_given is None:
            import asyncio

            return await asyncio.to_thread(self._run, keys, args)
        self.conn.round_trips += 1
        self.conn.scripts_run["scopes"] += 1
        try:
            return await self.conn._async_scripts()["scopes"](keys=keys, args=args)
        except self.conn.errors as exc:
            raise self._failed(exc) from exc

    def _reserve_args(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> tuple[list[str], list[Any]]:
        cost = "" if need[0] is None else repr(float(need[0]))
        return self._keys(names), [
            *self._args("reserve", now, call_id),
            cost,
            *need[1:],
            *names,
        ]

    @staticmethod
    def _answer(r: Any) -> Answer:
        return text(r[0]), text(r[1]), text(r[2]), float(text(r[3])), float(text(r[4]))

    def limit(self, name: str, limits: ScopeLimits, now: float) -> None:
        values = (limits.max_cost_usd, limits.max_tokens, limits.max_model_calls, limits.window)
        self._run(
            self._keys([name]),
            [*self._args("limit", now), *("" if v is None else v for v in values), name],
        )

    def reserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer:
        return self._answer(self._run(*self._reserve_args(names, call_id, need, now)))

    async def areserve(
        self,
        names: Sequence[str],
        call_id: str,
        need: tuple[float | None, float, float, float],
        now: float,
    ) -> Answer:
        return self._answer(await self._arun(*self._reserve_args(names, call_id, need, now)))

    def settle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool:
        args = [*self._args("settle", now, call_id), *used]
        return bool(int(self._run(self._keys(names), args)))

    async def asettle(self, names: Sequence[str], call_id: str, used: Four, now: float) -> bool:
        args = [*self._args("settle", now, call_id), *used]
        return bool(int(await self._arun(self._keys(names), args)))

    def release(self, names: Sequence[str], call_id: str) -> None:
        self._run(self._keys(names), self._args("release", 0.0, call_id))

    def view(self, name: str, now: float) -> dict[str, Any]:
        r = self._run(self._keys([name]), self._args("view", now))
        spent, held = [float(text(x)) for x in r[0:4]], [float(text(x)) for x in r[4:8]]
        cost, tokens, calls, window = (_num(x) for x in r[9:13])
        return {
            "limits": ScopeLimits(
                cost,
                int(tokens) if tokens is not None else None,
                int(calls) if calls is not None else None,
                window,
            ),
            "spent": dict(zip(DIMENSIONS, spent, strict=True)),
            "held": dict(zip(DIMENSIONS, held, strict=True)),
            "in_flight": int(r[8]),
        }

    def _call(self, fn: Any, *args: Any) -> Any:
        self.conn.round_trips += 1
        try:
            return fn(*args)
        except self.conn.errors as exc:
            raise self._failed(exc) from exc

    def names(self) -> list[str]:
        return sorted(text(n) for n in self._call(self.conn.client.smembers, f"{self.tag}:names"))

    def wait(self, name: str, run_id: str, checkpoint_id: str) -> None:
        self._call(self.conn.client.hset, f"{self.tag}:waiting:{name}", run_id, checkpoint_id)

    def unwait(self, names: Sequence[str], run_id: str) -> None:
        for name in names:
            self._call(self.conn.client.hdel, f"{self.tag}:waiting:{name}", run_id)

    def waiting(self, name: str) -> dict[str, str]:
        raw = self._call(self.conn.client.hgetall, f"{self.tag}:waiting:{name}")
        return {text(k): text(v) for k, v in raw.items()}

    def reset(self) -> None:
        """Delete every scope of this prefix (one key at a time: a cluster's nodes)."""
        try:
            for key in list(self.conn.client.scan_iter(match=f"{self.tag}:*")):
                self.conn.client.delete(key)
        except self.conn.errors:
            pass
