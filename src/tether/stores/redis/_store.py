"""Guard state shared by a fleet through Redis.

Every transition runs as one Lua script on the server (atomic, one round trip). The
scripts are translations of :mod:`tether.stores._logic`; the same behavioural tests
run against both.

A limiter's success is sent with the process's next admission request (or with every
16th success when no admission request comes), so a limiter-gated call costs one round
trip, its admission, on the success path.

Round trips on the success path of a breaker-guarded call: the state is read from a
local cache refreshed at most every ``cache_ttl`` seconds (default 1 s) and by every
failure this process records, and a success is written only when it changes
something (a failure count to reset, a half-open probe, a failure-rate window). In
a steady healthy state that is no round trip per call and one per ``cache_ttl``. The
cost: after another process opens the breaker this one may keep calling for up to
``cache_ttl`` seconds (its first failure then refreshes the cache at once). Set
``cache_ttl=0`` for an exact view at one round trip per call.

When Redis cannot be reached the store falls back to this process's memory, logs
one warning, tries Redis again every ``reconnect_interval`` seconds and goes back to
it (with another log line) once it answers: an outage of Redis never takes the
agent down, it only makes the guards local for a while.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Generator
from typing import Any, TypeVar

from tether._errors import require
from tether.clock import system_clock
from tether.redaction._redact import safe_url
from tether.stores._base import redis_client
from tether.stores._logic import (
    CALL,
    DENY,
    PROBE_SHARE,
    QUEUE_WAIT_CAP,
    BreakerConfig,
    LimiterConfig,
)
from tether.stores._memory import MemoryStore

__all__ = ["RedisStore"]

T = TypeVar("T")

_log = logging.getLogger("tether")

_FMT = """
local function fmt(x) return string.format('%.17g', x) end
"""

# Twins of stores._logic.breaker_acquire / breaker_record. Both return the state's
# version (bumped on every transition) so that other processes learn of transitions.
BREAKER_ACQUIRE = (
    _FMT
    + """
local k = KEYS[1]
local now, cooldown, half_max, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not now then  -- the server's clock: every process measures cooldowns on one clock
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local v = redis.call('HMGET', k, 'state', 'retry_at', 'inflight', 'probe_ok', 'probe_deadline', 'failures', 'version')
local state = v[1] or 'closed'
local retry_at = tonumber(v[2]) or 0
local inflight = tonumber(v[3]) or 0
local probe_ok = tonumber(v[4]) or 0
local probe_deadline = tonumber(v[5]) or 0
local failures = tonumber(v[6]) or 0
local version = tonumber(v[7]) or 0
local old = state
local changed = false
if state == 'open' then
  if now < retry_at then return {old, 'open', fmt(retry_at), 'deny', failures, version, fmt(now)} end
  state = 'half_open'; inflight = 0; probe_ok = 0; changed = true
  version = version + 1
end
if state == 'half_open' then
  if inflight > 0 and now >= probe_deadline then inflight = 0; changed = true end
  if inflight < 1 + probe_ok and probe_ok < half_max then
    inflight = inflight + 1
    probe_deadline = now + cooldown
    redis.call('HSET', k, 'state', state, 'inflight', inflight, 'probe_ok', probe_ok,
               'probe_deadline', fmt(probe_deadline), 'version', version)
    redis.call('PEXPIRE', k, ttl)
    return {old, 'half_open', '0', 'probe', failures, version, fmt(now)}
  end
  if changed then  -- a refusal writes nothing unless the state itself moved
    redis.call('HSET', k, 'state', state, 'inflight', inflight, 'probe_ok', probe_ok, 'version', version)
    redis.call('PEXPIRE', k, ttl)
  end
  return {old, 'half_open', fmt(math.min(probe_deadline, now + math.min(1.0, cooldown))), 'deny', failures, version, fmt(now)}
end
return {old, 'closed', '0', 'call', failures, version, fmt(now)}
"""
)

BREAKER_RECORD = (
    _FMT
    + """
local k = KEYS[1]
local now, permit, failed = tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'
if not now then  -- the server's clock: every process measures cooldowns on one clock
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local threshold, cooldown, half_max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local window, min_calls, rate, ttl = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local probe_interval, share = tonumber(ARGV[11]), tonumber(ARGV[12])
local v = redis.call('HMGET', k, 'state', 'retry_at', 'inflight', 'probe_ok', 'failures', 'window',
                     'opened_at', 'open_wait', 'version')
local state = v[1] or 'closed'
local retry_at = tonumber(v[2]) or 0
local inflight = tonumber(v[3]) or 0
local probe_ok = tonumber(v[4]) or 0
local failures = tonumber(v[5]) or 0
local w = v[6] or ''
local opened_at = tonumber(v[7]) or 0
local open_wait = tonumber(v[8]) or 0
local version = tonumber(v[9]) or 0
local old = state
local function trip()
  local wait = cooldown
  if probe_interval > 0 then
    if state ~= 'half_open' then
      wait = math.min(cooldown, probe_interval)
    else
      local grown = math.max(probe_interval, share * (now - opened_at))
      wait = math.min(cooldown, 2.0 * math.max(open_wait, probe_interval), grown)
    end
  end
  if state ~= 'half_open' then opened_at = now end
  state = 'open'; retry_at = now + wait; open_wait = wait
  failures = 0; w = ''; inflight = 0; probe_ok = 0
end
if permit == 'probe' and state == 'half_open' then
  inflight = math.max(0, inflight - 1)
  if failed then trip() else
    probe_ok = probe_ok + 1
    if probe_ok >= half_max then
      state = 'closed'; failures = 0; w = ''; inflight = 0; probe_ok = 0
    end
  end
elseif state == 'closed' then
  if failed then failures = failures + 1 else failures = 0 end
  local tripped = failures >= threshold
  if window > 0 then
    if failed then w = w .. '1' else w = w .. '0' end
    if #w > window then w = string.sub(w, -window) end
    local _, ones = string.gsub(w, '1', '')
    if #w >= min_calls and ones >= rate * #w then tripped = true end
  end
  if tripped then trip() end
else
  return {old, state, fmt(retry_at), failures, version, fmt(now)}
end
if state ~= old then version = version + 1 end
redis.call('HSET', k, 'state', state, 'retry_at', fmt(retry_at), 'inflight', inflight,
           'probe_ok', probe_ok, 'failures', failures, 'window', w, 'opened_at', fmt(opened_at),
           'open_wait', fmt(open_wait), 'version', version)
redis.call('PEXPIRE', k, ttl)
return {old, state, fmt(retry_at), failures, version, fmt(now)}
"""
)

BUDGET_SPEND = (
    _FMT
    + """
local k = KEYS[1]
local cap, cost, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = tonumber(redis.call('HGET', k, 'tokens')) or cap
if t >= cost then
  t = t - cost
  redis.call('HSET', k, 'tokens', fmt(t))
  redis.call('PEXPIRE', k, ttl)
  return {1, fmt(t)}
end
return {0, fmt(t)}
"""
)

BUDGET_REFUND = (
    _FMT
    + """
local k = KEYS[1]
local cap, amount, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = tonumber(redis.call('HGET', k, 'tokens')) or cap
t = math.min(cap, t + amount)
redis.call('HSET', k, 'tokens', fmt(t))
redis.call('PEXPIRE', k, ttl)
return fmt(t)
"""
)

_LIMITER_LOAD = """
local k = KEYS[1]
local now = tonumber(ARGV[1])
local initial, min_rate, max_rate, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local beta, increase, interval_s, ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local horizon = tonumber(ARGV[10])
local v = redis.call('HMGET', k, 'rate', 'ssthresh', 'tat', 'last_decrease', 'ok_since_decrease',
                     'failed_since_decrease', 'queued', 'queued_at')
local rate, ssthresh, tat, last_decrease, oks, fails
local queued, queued_at = tonumber(v[7]) or 0, tonumber(v[8]) or now
if v[1] then
  rate, ssthresh, tat = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  last_decrease, oks, fails = tonumber(v[4]), tonumber(v[5]), tonumber(v[6]) or 0
else
  rate, ssthresh, tat, last_decrease, oks, fails = initial, max_rate, now, -1e18, 0, 0
end
local function save()
  redis.call('HSET', k, 'rate', fmt(rate), 'ssthresh', fmt(ssthresh), 'tat', fmt(tat),
             'last_decrease', fmt(last_decrease), 'ok_since_decrease', oks, 'failed_since_decrease', fails,
             'queued', fmt(queued), 'queued_at', fmt(queued_at))
  redis.call('PEXPIRE', k, ttl)
end
-- successes a process saw since its last script: applied here, so a success costs no round trip
local function apply_oks(n)
  for _ = 1, n do
    oks = oks + 1
    if rate < ssthresh then rate = rate + 1.0
    else rate = rate + math.max(1.0, increase * rate) / rate end
    rate = math.min(max_rate, rate)
  end
end
apply_oks(tonumber(ARGV[11]) or 0)
"""

LIMITER_ACQUIRE = (
    _FMT
    + _LIMITER_LOAD
    + """
local interval = 1.0 / rate
local t = math.max(tat, now - (burst - 1.0) * interval)
local wait = math.max(0, t - now)
if wait > horizon then
  queued = math.max(0, queued - (now - queued_at) * rate) + 1
  queued_at = now
  save()
  return {fmt(wait - horizon + math.min(queued * interval, QUEUE_WAIT_CAP)), 0, fmt(rate)}
end
tat = t + interval
save()
return {fmt(wait), 1, fmt(rate)}
"""
).replace("QUEUE_WAIT_CAP", repr(QUEUE_WAIT_CAP))

LIMITER_FEEDBACK = (
    _FMT
    + _LIMITER_LOAD
    + """
local outcome = ARGV[12]
if outcome == 'ok' then
  apply_oks(1)
elseif outcome ~= 'none' then
  fails = fails + 1
  local outage = fails >= 20 and fails >= 9 * oks
  if (outcome == 'throttled' or outage) and now - last_decrease >= interval_s then
    if oks > 0 then ssthresh = math.max(min_rate, rate * beta) end
    rate = math.max(min_rate, rate * beta)
    last_decrease = now
    oks = 0
    fails = 0
  elseif outcome == 'failed' and rate < ssthresh and 3 * oks >= fails then
    rate = math.min(max_rate, rate + 1.0)
  end
end
save()
return fmt(rate)
"""
)


_OK_BATCH = 16  # successes recorded without an acquire are sent at least this often


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# A breaker's state and the server's clock in one round trip, on the node that holds the
# key (a pipeline with TIME is refused by Redis Cluster clients).
BREAKER_READ = """
local v = redis.call('HMGET', KEYS[1], 'state', 'retry_at')
local t = redis.call('TIME')
return {v[1] or false, v[2] or false, t[1], t[2]}
"""

# An operator opens a breaker for ARGV[2] seconds, or closes it (ARGV[1]); the version moves
# so that every process's cached answer is replaced at its next read.
BREAKER_FORCE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if ARGV[1] == 'open' then
  local wait = tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'state', 'open', 'retry_at', string.format('%.6f', now + wait),
             'opened_at', string.format('%.6f', now), 'open_wait', wait, 'inflight', 0, 'probe_ok', 0)
else
  redis.call('HSET', KEYS[1], 'state', 'closed', 'retry_at', 0, 'failures', 0, 'window', '',
             'inflight', 0, 'probe_ok', 0)
end
redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# The configuration of a name, kept beside its state: stored by the first object, returned
# ('' when the same) so that an object with another configuration is refused.
BIND = """
local cur = redis.call('HGET', KEYS[1], 'cfg')
if cur then
  if cur == ARGV[1] then return '' end
  return cur
end
redis.call('HSET', KEYS[1], 'cfg', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ''
"""

_SCRIPTS = (
    ("bind", BIND),
    ("breaker_read", BREAKER_READ),
    ("breaker_force", BREAKER_FORCE),
    ("breaker_acquire", BREAKER_ACQUIRE),
    ("breaker_record", BREAKER_RECORD),
    ("budget_spend", BUDGET_SPEND),
    ("budget_refund", BUDGET_REFUND),
    ("limiter_acquire", LIMITER_ACQUIRE),
    ("limiter_feedback", LIMITER_FEEDBACK),
)
Plan = Generator[tuple[str, str, list[Any]], Any, T]


class RedisStore:
    """Breaker, budget and limiter state in Redis, shared by every process using it.

    >>> store = RedisStore("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    >>> breaker = tether.CircuitBreaker("payments", store=store)  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "tether",
        key_ttl: float = 86_400.0,
        cache_ttl: float = 1.0,
        reconnect_interval: float = 1.0,
        socket_timeout: float = 0.5,
        client: Any = None,
        aclient: Any = None,
        server_time: bool = True,
    ) -> None:
        if cache_ttl < 0:
            raise ValueError(f"cache_ttl must be >= 0, got {cache_ttl!r}")
        if key_ttl <= 0:
            raise ValueError(f"key_ttl must be > 0, got {key_ttl!r}")
        redis = require("redis", "redis")
        self.url = safe_url(url) if client is None else repr(client)
        self.prefix = prefix
        self.cache_ttl = float(cache_ttl)
        #: breakers measure their cooldowns on the Redis server's clock (``TIME``), so that a
        #: process whose clock runs ahead or behind cannot probe early or late; ``False``
        #: measures on the callers' clocks (a VirtualClock in tests)
        self.server_time = server_time
        self.reconnect_interval = float(reconnect_interval)
        self._ttl_ms = int(key_ttl * 1000)
        # every Redis error means the store is unavailable: a refused connection, but
        # also an error reply (OOM, READONLY, NOSCRIPT after a flush, ACL refusals)
        self._errors: tuple[type[BaseException], ...] = (
            redis.RedisError,  # type: ignore[attr-defined]
            OSError,
        )
        self.client = client or redis_client(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
            health_check_interval=0,
        )  # fmt: skip
        self._scripts = {name: self.client.register_script(src) for name, src in _SCRIPTS}
        # the asyncio client: yours, or one made from url; a store built on a sync client
        # only has no asyncio twin, and runs its scripts in a worker thread under acall
        self._aurl = url if client is None else None
        self._socket_timeout = socket_timeout
        self._aclient_given = aclient
        self._aloop: Any = None
        self._ascripts: dict[str, Any] = {}
        self._asking: dict[str, Any] = {}  # breaker name -> future of the task asking Redis
        self._aclient_made: Any = None
        self.fallback = MemoryStore()
        self._down_until: float | None = None
        # name -> (state, retry_at, failures, fetched at, version); see the module docstring
        self._breaker_cache: dict[str, tuple[str, float, int, float, int]] = {}
        self._budget_full: dict[str, float] = {}
        self._pending_ok: dict[str, int] = {}  # limiter successes not yet sent
        self._limiter_rate: dict[str, float] = {}
        self._limiter_gate: dict[str, float] = {}  # name -> when this process may ask again
        self.round_trips = 0
        self.scripts_run: Counter[str] = Counter()  # round trips by script

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}:{kind}:{name}"

    def _may_run(self, script: str) -> bool:
        if self._down_until is not None and system_clock.now() < self._down_until:
            return False
        self.round_trips += 1
        self.scripts_run[script] += 1
        return True

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

    def _run(self, script: str, key: str, args: list[Any]) -> Any:
        """Run a script; None when Redis is unreachable (the caller falls back)."""
        if not self._may_run(script):
            return None
        try:
            result = self._scripts[script](keys=[key], args=args)
        except self._errors as exc:
            self._unavailable(exc)
            return None
        self._answered()
        return result

    async def _arun(self, script: str, key: str, args: list[Any]) -> Any:
        """The async twin of :meth:`_run`, on ``redis.asyncio``: the event loop never blocks."""
        if self._aurl is None and self._aclient_given is None:
            import asyncio

            return await asyncio.to_thread(self._run, script, key, args)
        if not self._may_run(script):
            return None
        try:
            scripts = self._async_scripts()
            result = await scripts[script](keys=[key], args=args)
        except self._errors as exc:
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
                str(self._aurl), asyncio=True, socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout, health_check_interval=0,
            )  # fmt: skip
            self._ascripts = {name: client.register_script(src) for name, src in _SCRIPTS}
            self._aloop = loop
        return self._ascripts

    def _drive(self, plan: Generator[tuple[str, str, list[Any]], Any, T]) -> T:
        """Run a plan with the sync client: each script it asks for, then its answer."""
        try:
            step = next(plan)
            while True:
                step = plan.send(self._run(*step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _adrive(self, plan: Generator[tuple[str, str, list[Any]], Any, T]) -> T:
        """Run a plan with the asyncio client."""
        try:
            step = next(plan)
            while True:
                step = plan.send(await self._arun(*step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and the local fallback is in use."""
        return self._down_until is not None

    def bind(self, kind: str, name: str, config: str) -> str | None:
        """Keep ``config`` beside the state of ``kind:name`` if it has none; the other one if
        it differs (this process's memory while Redis is unreachable)."""
        if not self.degraded:
            self.round_trips += 1
            self.scripts_run["bind"] += 1
            try:
                key = self._key(kind, name)
                answer = self._scripts["bind"](keys=[key], args=[config, self._ttl_ms])
            except self._errors:
                pass  # checked here only: the store's first call will say that Redis is down
            else:
                return _s(answer) or None
        return self.fallback.bind(kind, name, config)

    # --- breaker --------------------------------------------------------------------

    def _cached_acquire(self, name: str, now: float) -> tuple[str, str, float, str] | None:
        """The answer the cache can give without Redis (the success path), or None."""
        cached = self._breaker_cache.get(name)
        if cached is not None:
            state, retry_at = cached[0], cached[1]
            # an open breaker cannot change before its retry_at: no need to ask until then
            if state in ("open", "half_open") and now < retry_at:
                return state, state, retry_at, DENY
            fresh = self.cache_ttl > 0 and system_clock.now() - cached[3] < self.cache_ttl
            if state == "closed" and fresh:
                return "closed", "closed", 0.0, CALL
        return None

    def _p_breaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> Plan[tuple[str, str, float, str]]:
        cached = self._cached_acquire(name, now)
        if cached is not None:
            return cached
        r = yield ("breaker_acquire", self._key("breaker", name),
                      [self._when(now), cfg.cooldown, cfg.half_open_max_calls, self._ttl_ms])  # fmt: skip
        if r is None:
            return self.fallback.breaker_acquire(name, now, cfg)
        old, new, permit = _s(r[0]), _s(r[1]), _s(r[3])
        retry_at = self._caller_time(float(_s(r[2])), now, float(_s(r[6])))
        old = self._remember(name, old, new, retry_at, int(r[4]), int(r[5]))
        return old, new, retry_at, permit

    def breaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]:
        return self._cached_acquire(name, now) or self._drive(
            self._p_breaker_acquire(name, now, cfg)
        )

    async def abreaker_acquire(
        self, name: str, now: float, cfg: BreakerConfig
    ) -> tuple[str, str, float, str]:
        """Like :meth:`breaker_acquire`; when the cache cannot answer, one task of this
        process asks Redis and the others waiting on the same breaker use its answer."""
        import asyncio

        plan = self._p_breaker_acquire(name, now, cfg)
        try:
            step = next(plan)
        except StopIteration as done:  # the cache answered
            return done.value  # type: ignore[no-any-return]
        asking = self._asking.get(name)
        if asking is not None and not asking.done():
            plan.close()
            await asking  # another task of this process is asking Redis right now
            return await self._adrive(self._p_breaker_acquire(name, now, cfg))
        self._asking[name] = asyncio.get_running_loop().create_future()
        try:
            while True:
                step = plan.send(await self._arun(*step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            fut = self._asking.pop(name)
            if not fut.done():
                fut.set_result(None)

    def _nothing_to_record(self, name: str, permit: str, failed: bool, cfg: BreakerConfig) -> bool:
        """A success of a closed breaker with nothing to reset needs no round trip."""
        if failed or permit != CALL or cfg.window != 0:
            return False
        cached = self._breaker_cache.get(name)
        # with cache_ttl=0 the cache was refreshed by this very call's acquire
        fresh = self.cache_ttl == 0 or (
            cached is not None and system_clock.now() - cached[3] < self.cache_ttl
        )
        return cached is not None and cached[0] == "closed" and cached[2] == 0 and fresh

    def _when(self, now: float) -> Any:
        """The time a breaker script measures with: the server's (``""``) or the caller's."""
        return "" if self.server_time else now

    def _caller_time(self, at: float, caller_now: float, store_now: float) -> float:
        """A time of the store's clock on the caller's (a retry_at of 0 stays 0)."""
        if not self.server_time or at <= 0:
            return at
        return caller_now + (at - store_now)

    def _remember(
        self, name: str, old: str, new: str, retry_at: float, failures: int, version: int
    ) -> str:
        """Cache what the store said; the state this process knew before, when another
        process moved it meanwhile (so that this process's hooks hear of it too)."""
        cached = self._breaker_cache.get(name)
        self._breaker_cache[name] = (new, retry_at, failures, system_clock.now(), version)
        if cached is not None and cached[4] < version and cached[0] != old:
            return cached[0]
        return old

    def _p_breaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> Plan[tuple[str, str, float]]:
        if self._nothing_to_record(name, permit, failed, cfg):
            return "closed", "closed", 0.0
        args = [self._when(now), permit, "1" if failed else "0", cfg.failure_threshold, cfg.cooldown,
                cfg.half_open_max_calls, cfg.window, cfg.min_calls, cfg.failure_rate,
                self._ttl_ms, cfg.probe_interval, PROBE_SHARE]  # fmt: skip
        r = yield ("breaker_record", self._key("breaker", name), args)
        if r is None:
            return self.fallback.breaker_record(name, now, permit, failed, cfg)
        old, new = _s(r[0]), _s(r[1])
        retry_at = self._caller_time(float(_s(r[2])), now, float(_s(r[5])))
        old = self._remember(name, old, new, retry_at, int(r[3]), int(r[4]))
        return old, new, retry_at

    def breaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        if self._nothing_to_record(name, permit, failed, cfg):
            return "closed", "closed", 0.0
        return self._drive(self._p_breaker_record(name, now, permit, failed, cfg))

    async def abreaker_record(
        self, name: str, now: float, permit: str, failed: bool, cfg: BreakerConfig
    ) -> tuple[str, str, float]:
        return await self._adrive(self._p_breaker_record(name, now, permit, failed, cfg))

    def breaker_state(self, name: str, now: float) -> tuple[str, float]:
        answer = self._run("breaker_read", self._key("breaker", name), [])
        if answer is None:
            return self.fallback.breaker_state(name, now)
        state, retry_at, seconds, micros = answer
        st = _s(state) if state else "closed"
        store_now = int(seconds) + int(micros) / 1e6 if self.server_time else now
        at = self._caller_time(float(_s(retry_at)) if retry_at else 0.0, now, store_now)
        if st == "open" and now >= at:
            return "half_open", at
        return st, at

    # --- the operator's view: every breaker, and forcing one ----------------------------

    def breaker_names(self, limit: int = 1000) -> list[str]:
        """The names of the breakers this store holds state for."""
        head = f"{self.prefix}:breaker:"
        names = []
        for key in self.client.scan_iter(match=head + "*", count=500):
            names.append(_s(key)[len(head) :])
            if len(names) >= limit:
                break
        return sorted(names)

    def breaker_force(self, name: str, state: str, seconds: float = 0.0) -> None:
        """Open a breaker for ``seconds`` (an operator's decision: the dependency is down),
        or close it; every process sees it at its next read (its cache is one ``cache_ttl``)."""
        if state not in ("open", "closed"):
            raise ValueError(f"state must be 'open' or 'closed', got {state!r}")
        self._scripts["breaker_force"](keys=[self._key("breaker", name)],
                                       args=[state, float(seconds), self._ttl_ms])  # fmt: skip
        self._breaker_cache.clear()

    # --- budget ---------------------------------------------------------------------

    def _p_budget_spend(self, name: str, capacity: float, cost: float) -> Plan[tuple[bool, float]]:
        self._budget_full.pop(name, None)
        r = yield ("budget_spend", self._key("budget", name), [capacity, cost, self._ttl_ms])
        if r is None:
            return self.fallback.budget_spend(name, capacity, cost)
        return bool(int(r[0])), float(_s(r[1]))

    def budget_spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        return self._drive(self._p_budget_spend(name, capacity, cost))

    async def abudget_spend(self, name: str, capacity: float, cost: float) -> tuple[bool, float]:
        return await self._adrive(self._p_budget_spend(name, capacity, cost))

    def _p_budget_refund(self, name: str, capacity: float, amount: float) -> Plan[float]:
        full_at = self._budget_full.get(name)
        if full_at is not None and system_clock.now() - full_at < max(self.cache_ttl, 0.0):
            return float(capacity)
        r = yield ("budget_refund", self._key("budget", name), [capacity, amount, self._ttl_ms])
        if r is None:
            return self.fallback.budget_refund(name, capacity, amount)
        tokens = float(_s(r))
        if tokens >= capacity:
            self._budget_full[name] = system_clock.now()
        return tokens

    def budget_refund(self, name: str, capacity: float, amount: float) -> float:
        return self._drive(self._p_budget_refund(name, capacity, amount))

    async def abudget_refund(self, name: str, capacity: float, amount: float) -> float:
        return await self._adrive(self._p_budget_refund(name, capacity, amount))

    def budget_tokens(self, name: str, capacity: float) -> float:
        try:
            self.round_trips += 1
            raw = self.client.hget(self._key("budget", name), "tokens")
        except self._errors:
            return self.fallback.budget_tokens(name, capacity)
        return float(_s(raw)) if raw is not None else float(capacity)

    # --- limiter --------------------------------------------------------------------

    def _limiter_args(self, now: float, cfg: LimiterConfig) -> list[Any]:
        return [now, cfg.initial_rate, cfg.min_rate, cfg.max_rate, cfg.burst, cfg.beta,
                cfg.increase, cfg.decrease_interval, self._ttl_ms, cfg.horizon]  # fmt: skip

    def _p_limiter_acquire(
        self, name: str, now: float, cfg: LimiterConfig
    ) -> Plan[tuple[float, bool]]:
        gate = self._limiter_gate.get(name)
        if gate is not None and now < gate:
            # the limiter turned a caller of this process away moments ago: the others
            # wait for the same moment without asking Redis again
            return gate - now, False
        pending = self._pending_ok.pop(name, 0)
        args = [*self._limiter_args(now, cfg), pending]
        r = yield ("limiter_acquire", self._key("limiter", name), args)
        if r is None:
            return self.fallback.limiter_acquire(name, now, cfg)
        self._limiter_rate[name] = float(_s(r[2]))
        wait, admitted = float(_s(r[0])), bool(int(r[1]))
        if admitted:
            self._limiter_gate.pop(name, None)
        else:
            self._limiter_gate[name] = now + wait
        return wait, admitted

    def limiter_acquire(self, name: str, now: float, cfg: LimiterConfig) -> tuple[float, bool]:
        return self._drive(self._p_limiter_acquire(name, now, cfg))

    async def alimiter_acquire(
        self, name: str, now: float, cfg: LimiterConfig
    ) -> tuple[float, bool]:
        """Like :meth:`limiter_acquire`; the tasks of this process ask one at a time, so
        that one refusal closes the gate for all of them (as the sync client does)."""
        import asyncio

        while True:
            asking = self._asking.get(f"limiter:{name}")
            if asking is None or asking.done():
                break
            await asking
        key = f"limiter:{name}"
        self._asking[key] = asyncio.get_running_loop().create_future()
        try:
            return await self._adrive(self._p_limiter_acquire(name, now, cfg))
        finally:
            fut = self._asking.pop(key)
            if not fut.done():
                fut.set_result(None)

    def _p_limiter_feedback(
        self, name: str, now: float, outcome: str, cfg: LimiterConfig
    ) -> Plan[float]:
        if outcome == "ok" and not self.degraded and self._pending_ok.get(name, 0) < _OK_BATCH - 1:
            # a success travels with this process's next acquire: no round trip of its own
            self._pending_ok[name] = self._pending_ok.get(name, 0) + 1
            return self._limiter_rate.get(name, cfg.initial_rate)
        pending = self._pending_ok.pop(name, 0)
        if outcome == "ok":  # the batch is full: send it, this success with it
            pending, outcome = pending + 1, "none"
        args = [*self._limiter_args(now, cfg), pending, outcome]
        r = yield ("limiter_feedback", self._key("limiter", name), args)
        if r is None:
            return self.fallback.limiter_feedback(name, now, outcome, cfg)
        self._limiter_rate[name] = float(_s(r))
        return self._limiter_rate[name]

    def limiter_feedback(self, name: str, now: float, outcome: str, cfg: LimiterConfig) -> float:
        return self._drive(self._p_limiter_feedback(name, now, outcome, cfg))

    async def alimiter_feedback(
        self, name: str, now: float, outcome: str, cfg: LimiterConfig
    ) -> float:
        return await self._adrive(self._p_limiter_feedback(name, now, outcome, cfg))

    async def aclose(self) -> None:
        """Close the asyncio client of the running event loop (and the sync one)."""
        client = self._aclient_made or self._aclient_given
        self._aloop, self._aclient_made = None, None
        if client is not None:
            try:
                await client.aclose()
            except self._errors:
                pass
        self.close()

    def close(self) -> None:
        """Close the connections to Redis."""
        try:
            self.client.close()
        except self._errors:
            pass

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, name: str | None = None) -> None:
        """Delete the shared state of one name, or every key under this prefix."""
        self._breaker_cache.clear()
        self._budget_full.clear()
        self._pending_ok.clear()
        self._limiter_rate.clear()
        self._limiter_gate.clear()
        self.fallback.reset(name)
        try:
            if name is None:
                keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=500))
            else:
                keys = [self._key(k, name) for k in ("breaker", "budget", "limiter")]
            if keys:
                self.client.delete(*keys)
        except self._errors:
            pass
