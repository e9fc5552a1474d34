"""The Lua scripts of the Redis store: every state transition runs as one script on the
server (atomic, one round trip).

The breaker, budget and limiter scripts are translations of the pure state machines in
:mod:`tether.stores._logic`, and their numbers are not written twice: a ``${NAME}`` in a
script is replaced by the value of that constant of ``_logic`` when this module is
imported (an unknown name raises), so the two stores change together. The shared tests
(tests/test_store_tables.py) run the same tables through the memory store and Redis.

To add a script: write its source here (or in a module of its own beside this one, for a
new kind of state) and add it to :data:`SOURCES` under a name; the connection registers
every script with each client, and a part of the store runs it by that name.
"""

from __future__ import annotations

from string import Template

from tether.stores import _logic
from tether.stores.redis._scopes_lua import SCOPES
from tether.stores.redis._tokens_lua import TOKENS

__all__ = ["CONSTANTS", "SCRIPTS", "SOURCES", "render", "rendered"]

#: the constants of ``_logic`` a script may name as ``${NAME}``
CONSTANTS = (
    "BROWNOUT_RATIO",
    "NEVER",
    "OUTAGE_FAILURES",
    "OUTAGE_RATIO",
    "PROBE_ASK_AGAIN",
    "PROBE_GROWTH",
    "PROBE_SHARE",
    "QUEUE_WAIT_CAP",
    "RATE_STEP",
)


def render(source: str) -> str:
    """A script's source with every ``${NAME}`` replaced by the value ``_logic.NAME`` has
    now, as a Lua number; a name that is not one of :data:`CONSTANTS` raises KeyError."""
    values = {name: repr(getattr(_logic, name)) for name in CONSTANTS}
    return Template(source).substitute(values)


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
  if inflight < 1 + probe_ok and inflight + probe_ok < half_max then
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
  local ask_again = math.min(probe_deadline, now + math.min(${PROBE_ASK_AGAIN}, cooldown))
  return {old, 'half_open', fmt(ask_again), 'deny', failures, version, fmt(now)}
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
local probe_interval, share = tonumber(ARGV[11]), ${PROBE_SHARE}
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
      wait = math.min(cooldown, ${PROBE_GROWTH} * math.max(open_wait, probe_interval), grown)
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
      state = 'closed'; failures = 0; w = ''; inflight = 0; probe_ok = 0; retry_at = 0
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

# A budget's tokens (a full bucket when it has none yet) and a save of them; ARGV: the
# capacity, the amount to spend or refund, the key's ttl.
_BUDGET_LOAD = """
local k = KEYS[1]
local cap, amount, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = tonumber(redis.call('HGET', k, 'tokens')) or cap
local function save()
  redis.call('HSET', k, 'tokens', fmt(t))
  redis.call('PEXPIRE', k, ttl)
end
"""

BUDGET_SPEND = (
    _FMT
    + _BUDGET_LOAD
    + """
if t >= amount then
  t = t - amount
  save()
  return {1, fmt(t)}
end
return {0, fmt(t)}
"""
)

BUDGET_REFUND = (
    _FMT
    + _BUDGET_LOAD
    + """
t = math.min(cap, t + amount)
save()
return fmt(t)
"""
)

_LIMITER_LOAD = """
local k = KEYS[1]
local now = tonumber(ARGV[1])
if not now then  -- the server's clock: a host whose clock is off cannot move the line
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
end
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
  rate, ssthresh, tat, last_decrease, oks, fails = initial, max_rate, now, ${NEVER}, 0, 0
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
    if rate < ssthresh then rate = rate + ${RATE_STEP}
    else rate = rate + math.max(${RATE_STEP}, increase * rate) / rate end
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
  return {fmt(wait - horizon + math.min(queued * interval, ${QUEUE_WAIT_CAP})), 0, fmt(rate)}
end
tat = t + interval
save()
return {fmt(wait), 1, fmt(rate)}
"""
)

LIMITER_FEEDBACK = (
    _FMT
    + _LIMITER_LOAD
    + """
local outcome = ARGV[12]
if outcome == 'ok' then
  apply_oks(1)
elseif outcome ~= 'none' then
  fails = fails + 1
  local outage = fails >= ${OUTAGE_FAILURES} and fails >= ${OUTAGE_RATIO} * oks
  if (outcome == 'throttled' or outage) and now - last_decrease >= interval_s then
    if oks > 0 then ssthresh = math.max(min_rate, rate * beta) end
    rate = math.max(min_rate, rate * beta)
    last_decrease = now
    oks = 0
    fails = 0
  elseif outcome == 'failed' and rate < ssthresh and ${BROWNOUT_RATIO} * oks >= fails then
    rate = math.min(max_rate, rate + ${RATE_STEP})
  end
end
save()
return fmt(rate)
"""
)


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


#: the source of every script the store runs, by name (its parts ask for a script by
#: this name); a ``${NAME}`` in a source stands for a constant of ``_logic``
SOURCES: dict[str, str] = {
    "bind": BIND,
    "breaker_read": BREAKER_READ,
    "breaker_force": BREAKER_FORCE,
    "breaker_acquire": BREAKER_ACQUIRE,
    "breaker_record": BREAKER_RECORD,
    "budget_spend": BUDGET_SPEND,
    "budget_refund": BUDGET_REFUND,
    "limiter_acquire": LIMITER_ACQUIRE,
    "limiter_feedback": LIMITER_FEEDBACK,
    "tokens": TOKENS,
    "scopes": SCOPES,
}


def rendered() -> dict[str, str]:
    """Every script of :data:`SOURCES`, rendered with the constants as they are now."""
    return {name: render(source) for name, source in SOURCES.items()}


#: the scripts as the store registers them with each client
SCRIPTS: dict[str, str] = rendered()
