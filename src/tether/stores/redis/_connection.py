"""The Redis store's connection: its clients, its scripts, and its fallback to memory.

Every part of the store (breakers, budgets, limiters) states what it wants from Redis as
a *plan*: a generator that yields ``(script, key, args)`` and receives the script's
answer, or None when Redis cannot be reached (then the part answers from
:attr:`Connection.fallback`, this process's memory). :meth:`Connection.drive` runs a
plan on the sync client and :meth:`Connection.adrive` on the asyncio one, so the two
shells cannot drift: each script is a :class:`~tether._sansio.Call` of :meth:`run`
(awaited: :meth:`arun`), run by tether's one pair of drivers (:mod:`tether._sansio`).

When Redis cannot be reached the connection logs one warning, tries Redis again every
``reconnect_interval`` seconds and goes back to it (with another log line) once it
answers.

The clients it makes send each script once: redis-py sends a command again after a
timeout (ten times by default), but a script whose reply timed out may have run, and most
of the store's scripts (a breaker's failure count, a probe's slot, a retry budget's spend,
a limiter's slot) would then apply twice. A call that times out falls back instead. (A
client made from a plain ``redis://`` URL sends once already; one made from a
``redis+cluster://`` URL, or with ``redis.Redis(host=...)``, retries ten times: the store
says so in a warning when it is given such a client.)
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Generator
from typing import Any, TypeVar

from tether import _sansio
from tether._sansio import Call
from tether.clock import system_clock
from tether.redaction._redact import safe_url
from tether.stores._base import redis_client
from tether.stores._memory import MemoryStore
from tether.stores.redis._scripts import SCRIPTS

__all__ = ["Connection", "Plan", "resends", "sent_once", "text"]

T = TypeVar("T")

#: what a part of the store asks Redis for: scripts to run, one at a time, then its answer
Plan = Generator[tuple[str, str, list[Any]], Any, T]

_log = logging.getLogger("tether")


def sent_once(*, asyncio: bool = False) -> Any:
    """A redis-py retry setting that never sends a command again (see the module)."""
    from tether._errors import require

    retry: Any = require("redis.asyncio.retry" if asyncio else "redis.retry", "redis")
    backoff: Any = require("redis.backoff", "redis")
    return retry.Retry(backoff.NoBackoff(), 0)


def resends(client: Any) -> int:
    """How many times ``client`` sends a command again after a timeout or a dropped
    connection (redis-py's retries; 0 when it cannot say)."""
    retry = getattr(client, "retry", None)  # a RedisCluster's own
    if retry is None and callable(getattr(client, "get_retry", None)):
        retry = client.get_retry()
    get = getattr(retry, "get_retries", None)
    return int(get()) if callable(get) else 0


def text(value: Any) -> str:
    """A reply of Redis as text (the client answers bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Connection:
    """The clients of one store, the scripts registered on them, and the fallback."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        key_ttl: float,
        reconnect_interval: float,
        socket_timeout: float,
        client: Any,
        aclient: Any,
        server_time: bool,
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self.url = safe_url(url) if client is None else repr(client)
        self.prefix = prefix
        self.server_time = server_time
        self.reconnect_interval = float(reconnect_interval)
        self.ttl_ms = int(key_ttl * 1000)
        self.errors = errors
        self.client = client or redis_client(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            health_check_interval=0,
            retry=sent_once(),
        )
        self.scripts = {name: self.client.register_script(src) for name, src in SCRIPTS.items()}
        for given in (client, aclient):
            if given is not None and resends(given) > 0:
                _log.warning(
                    "tether: the Redis client given to the store sends a timed-out command "
                    "again (%d retries); a breaker's failure, a retry budget's spend or a "
                    "limiter's slot may then count twice. Make it with "
                    "retry=Retry(NoBackoff(), 0) (redis.retry, redis.backoff)",
                    resends(given),
                )
        # the asyncio client: yours, or one made from url; a store built on a sync client
        # only has no asyncio twin, and runs its scripts in a worker thread under adrive
        self._aurl = url if client is None else None
        self._socket_timeout = socket_timeout
        self._aclient_given = aclient
        self._aloop: Any = None
        self._ascripts: dict[str, Any] = {}
        self._aclient_made: Any = None
        self.fallback = MemoryStore()
        self._down_until: float | None = None
        self.round_trips = 0
        self.scripts_run: Counter[str] = Counter()  # round trips by script

    def key(self, kind: str, name: str) -> str:
        return f"{self.prefix}:{kind}:{name}"

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and the local fallback is in use."""
        return self._down_until is not None

    def when(self, now: float) -> Any:
        """The time a breaker script measures with: the server's (``""``) or the caller's."""
        return "" if self.server_time else now

    def caller_time(self, at: float, caller_now: float, store_now: float) -> float:
        """A time of the store's clock on the caller's (a retry_at of 0 stays 0)."""
        if not self.server_time or at <= 0:
            return at
        return caller_now + (at - store_now)

    def _may_run(self, script: str) -> bool:
        if self._down_until is not None and system_clock.now() < self._down_until:
            return False
        self.round_trips += 1
        self.scripts_run[script] += 1
        return True

    @property
    def socket_timeout(self) -> float:
        """How long a call waits for Redis's reply (the store's setting)."""
        return float(self._socket_timeout)

    def retry_now(self) -> None:
        """Let the next call try Redis now, before ``reconnect_interval`` has passed."""
        if self._down_until is not None:
            self._down_until = system_clock.now()

    def _unavailable(self, exc: BaseException) -> None:
        if self._down_until is None:
            _log.warning(
                "tether: Redis at %s is unavailable (%s: %s); breakers, budgets and limiters "
                "fall back to this process's memory until it answers again",
                self.url,
                type(exc).__name__,
                safe_url(str(exc)),
            )
        self._down_until = system_clock.now() + self.reconnect_interval

    def _answered(self) -> None:
        if self._down_until is not None:
            _log.warning("tether: Redis at %s answers again; shared state restored", self.url)
            self._down_until = None

    def run(self, script: str, key: str, args: list[Any]) -> Any:
        """Run a script; None when Redis is unreachable (the caller falls back)."""
        if not self._may_run(script):
            return None
        try:
            result = self.scripts[script](keys=[key], args=args)
        except self.errors as exc:
            self._unavailable(exc)
            return None
        self._answered()
        return result

    async def arun(self, script: str, key: str, args: list[Any]) -> Any:
        """The async twin of :meth:`run`, on ``redis.asyncio``: the event loop never blocks."""
        if self._aurl is None and self._aclient_given is None:
            import asyncio

            return await asyncio.to_thread(self.run, script, key, args)
        if not self._may_run(script):
            return None
        try:
            scripts = self._async_scripts()
            result = await scripts[script](keys=[key], args=args)
        except self.errors as exc:
            self._unavailable(exc)
            return None
        self._answered()
        return result

    def _async_scripts(self) -> dict[str, Any]:
        """The scripts on an asyncio client of the running event loop (made on first use)."""
        import asyncio

        loop = asyncio.get_running_loop()
        if self._aloop is not loop:
            client = self._aclient_made = self._aclient_given or redis_client(
                str(self._aurl),
                asyncio=True,
                socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout,
                health_check_interval=0,
                retry=sent_once(asyncio=True),
            )
            self._ascripts = {name: client.register_script(src) for name, src in SCRIPTS.items()}
            self._aloop = loop
        return self._ascripts

    def steps(self, plan: Plan[T]) -> _sansio.Plan[T]:
        """A plan's scripts as steps of tether's one vocabulary: each a call of :meth:`run`
        (:meth:`arun` on an event loop), its answer sent back to the plan."""
        send, run, arun = plan.send, self.run, self.arun
        answer: Any = None
        while True:
            try:
                script = send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            answer = yield Call(run, script, arun)

    def drive(self, plan: Plan[T]) -> T:
        """Run a plan with the sync client: each script it asks for, then its answer."""
        return _sansio.drive(self.steps(plan))

    async def adrive(self, plan: Plan[T]) -> T:
        """Run a plan with the asyncio client."""
        return await _sansio.adrive(self.steps(plan))

    def bind(self, kind: str, name: str, config: str) -> str | None:
        """Keep ``config`` beside the state of ``kind:name`` if it has none; the other one if
        it differs (this process's memory while Redis is unreachable)."""
        if not self.degraded:
            self.round_trips += 1
            self.scripts_run["bind"] += 1
            try:
                answer = self.scripts["bind"](
                    keys=[self.key(kind, name)], args=[config, self.ttl_ms]
                )
            except self.errors:
                pass  # checked here only: the store's first call will say that Redis is down
            else:
                return text(answer) or None
        return self.fallback.bind(kind, name, config)

    async def aclose(self) -> None:
        """Close the asyncio client of the running event loop (and the sync one)."""
        client = self._aclient_made or self._aclient_given
        self._aloop, self._aclient_made = None, None
        if client is not None:
            try:
                await client.aclose()
            except self.errors:
                pass
        self.close()

    def close(self) -> None:
        try:
            self.client.close()
        except self.errors:
            pass

    def delete(self, name: str | None, kinds: tuple[str, ...]) -> None:
        """Delete the keys of one name (of these kinds), or every key under the prefix."""
        try:
            if name is None:
                keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=500))
            else:
                keys = [self.key(k, name) for k in kinds]
            if keys:
                self.client.delete(*keys)
        except self.errors:
            pass
